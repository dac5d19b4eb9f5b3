"""The Kafka consumer loop traced with OpenTelemetry's confluent-kafka instrumentation, on a
real Kafka-protocol broker (Tansu): each message's ``idempotency <operation>`` span is a
child of the instrumentation's ``<topic> process`` span, with the messaging attributes the
loop knows (system, topic, partition, consumer group, offset, key, the message id
``<topic>.<partition>.<offset>``), one message at a time and in batches; a duplicate's span
links to the execution it replays.  ~10 s (two consumer group joins)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.instrumentation.confluent_kafka import ConfluentKafkaInstrumentor

from idempotent_tasks import IdempotencyHandler, MemoryStore, Outcome
from idempotent_tasks.consumers import IdempotentConsumer, Message
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

from ..consumers.conftest import (
    committed,
    create_topic,
    kafka_bootstrap,  # noqa: F401 - the session's Tansu broker
    kafka_config,
    produce,
    wait_for,
)
from .conftest import Spans, attributes, link_targets

pytestmark = pytest.mark.kafka


@pytest.fixture
def instrumented(spans: Spans) -> Iterator[Spans]:
    """confluent-kafka's Producer and Consumer, instrumented for this test only."""
    instrumentor = ConfluentKafkaInstrumentor()
    instrumentor.instrument(tracer_provider=spans.provider)
    try:
        yield spans
    finally:
        instrumentor.uninstrument()


@pytest.mark.parametrize("batch_size", [1, 4])
def test_otel_kafka_loop_spans_carry_the_messaging_attributes(
    instrumented: Spans, kafka_bootstrap: str, batch_size: int  # noqa: F811
) -> None:
    topic = create_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [
        {"value": json.dumps({"order": order}).encode(), "key": f"order-{n}".encode(),
         "headers": {"idempotency-key": key}}
        for n, order, key in ((1, "o-1", "k-1"), (2, "o-1", "k-1"), (3, "o-3", "k-3"))
    ])  # the second message: a duplicate of the first (a producer's retry)
    config = kafka_config(kafka_bootstrap)
    seen: list[tuple[Message, Outcome]] = []
    lock = threading.Lock()

    def on_outcome(message: Message, outcome: Outcome) -> None:
        with lock:
            seen.append((message, outcome))

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    consumer = IdempotentConsumer(handler, operation="orders.created", default_tenant="acme")
    loop = KafkaConsumerLoop(consumer, config, topics=[topic], batch_size=batch_size,
                             maintenance=False, on_outcome=on_outcome)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(lambda p: p["order"], stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(seen) == 3, 30, "three outcomes")
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic) == [3], 20,
                 "the offsets committed")
    finally:
        stop.set()
        thread.join(30)
    assert [o.kind for _, o in seen] == ["executed", "replayed", "executed"]
    check_spans(instrumented, topic, config["group.id"], seen)


def check_spans(spans: Spans, topic: str, group: str,
                seen: list[tuple[Message, Outcome]]) -> None:
    decisions = {attributes(s)["messaging.kafka.offset"]: s for s in spans.decisions()}
    assert sorted(decisions) == [0, 1, 2]
    process = {s.context.span_id: s for s in spans.named(f"{topic} process")}
    for message, outcome in seen:
        span = decisions[message.offset]
        assert span.parent is not None and span.parent.span_id in process
        got = attributes(span)
        assert got["idempotency.outcome"] == outcome.kind
        assert got["idempotency.key"] == outcome.key
        expected: dict[str, Any] = {
            "messaging.system": "kafka", "messaging.destination.name": topic,
            "messaging.destination.partition.id": "0", "messaging.consumer.group.name": group,
            "messaging.kafka.offset": message.offset,
            "messaging.kafka.message.key": f"order-{message.offset + 1}",
            "messaging.message.id": f"{topic}.0.{message.offset}",
            "messaging.operation.type": "process",
        }
        assert {k: got[k] for k in expected} == expected
    assert link_targets(decisions[1]) == [decisions[0].context.span_id]
