"""KafkaConsumerLoop against a real Kafka-protocol broker (Tansu, started per session)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler, MemoryStore
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop, consumer_config
from idempotent_tasks.testing import FaultyStore
from tests._claims import claimed, completed

from .conftest import committed, create_topic, kafka_config, produce, read_all, wait_for

pytestmark = pytest.mark.kafka


class ValidationError(Exception):
    pass


class Seen:
    """Thread-safe record of what the loop decided, for waiting on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: list[tuple[Message, Outcome]] = []

    def __call__(self, message: Message, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append((message, outcome))

    def kinds(self) -> Counter[str]:
        with self.lock:
            return Counter(o.kind for _, o in self.outcomes)


@contextmanager
def running(loop: KafkaConsumerLoop, fn: Callable[..., Any]) -> Iterator[threading.Event]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            loop.run(fn, stop=stop)
        except BaseException as exc:  # surfaced in the test thread below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the loop did not stop"
    if errors:
        raise errors[0]


def record(value: Any, key: str | None, **headers: str) -> dict[str, Any]:
    hdrs = {"idempotency-key": key} if key is not None else {}
    hdrs.update(headers)
    return {"value": json.dumps(value).encode(), "headers": hdrs}


def make_consumer(store: Any = None, **kwargs: Any) -> IdempotentConsumer:
    handler = IdempotencyHandler(store or MemoryStore(), metrics=None, lease_timeout=30,
                                 outcome_retry_timeout=0.1)
    kwargs.setdefault("default_tenant", "acme")
    return IdempotentConsumer(handler, operation="orders.created",
                              permanent=(ValidationError,), **kwargs)


@pytest.mark.parametrize("batch_size", [1, 8])
def test_producer_duplicates_are_replayed_and_everything_is_committed(
    kafka_bootstrap: str, batch_size: int
) -> None:
    topic = create_topic(kafka_bootstrap, partitions=2)
    records = []
    for i in range(10):
        for partition in (0, 1, 0):  # each logical message published 3 times, 2 partitions
            records.append({**record({"i": i}, f"k{i}"), "partition": partition})
    produce(kafka_bootstrap, topic, records)
    runs: Counter[int] = Counter()
    seen = Seen()
    config = kafka_config(kafka_bootstrap)
    loop = KafkaConsumerLoop(make_consumer(), config, topics=[topic], batch_size=batch_size,
                             on_outcome=seen, maintenance=False)

    def body(payload: Any) -> int:
        runs[payload["i"]] += 1
        return int(payload["i"]) * 10

    with running(loop, body):
        wait_for(lambda: sum(seen.kinds().values()) >= 30, 30, "30 outcomes")
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic, 2) == [20, 10],
                 20, "offsets committed to the end")
    assert runs == Counter(dict.fromkeys(range(10), 1))
    assert seen.kinds() == Counter({"executed": 10, "replayed": 20})
    assert all(o.result == int(o.key[1:]) * 10 for _, o in seen.outcomes)  # type: ignore[index]


def test_poison_and_rejected_go_to_the_dead_letter_topic_and_the_offset_moves_on(
    kafka_bootstrap: str,
) -> None:
    topic = create_topic(kafka_bootstrap)
    dlq = create_topic(kafka_bootstrap, prefix="dlq")
    produce(kafka_bootstrap, topic, [
        {**record({"bad": True}, "p1", trace="abc"), "key": b"order-1"},
        record({"ok": 1}, "g1"),
        {"value": b"{not json", "headers": {"idempotency-key": "r1"}},
        record({"ok": 2}, None),  # no key at all
        record({"ok": 3}, "g2"),
    ])
    seen = Seen()
    config = kafka_config(kafka_bootstrap)
    loop = KafkaConsumerLoop(make_consumer(), config, topics=[topic], dead_letter_topic=dlq,
                             on_outcome=seen, maintenance=False)

    def body(payload: Any) -> str:
        if payload.get("bad"):
            raise ValidationError("amount must be positive")
        return "ok"

    with running(loop, body):
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic) == [5], 30,
                 "offset 5 committed")
    assert [o.kind for _, o in seen.outcomes] == [
        "poisoned", "executed", "rejected", "rejected", "executed"
    ]
    letters = read_all(kafka_bootstrap, dlq, 3)
    assert len(letters) == 3
    first = dict(letters[0].headers())
    assert letters[0].value() == json.dumps({"bad": True}).encode()
    assert letters[0].key() == b"order-1"
    assert first[b"idempotency-error-code".decode()] == b"REQUEST_FAILED"
    assert first["idempotency-error"] == b"ValidationError"
    assert first["idempotency-original-topic"] == topic.encode()
    assert first["idempotency-original-partition"] == b"0"
    assert first["idempotency-original-offset"] == b"0"
    assert first["trace"] == b"abc" and first["idempotency-key"] == b"p1"
    codes = [dict(m.headers())["idempotency-error-code"] for m in letters[1:]]
    assert codes == [b"INVALID_PAYLOAD", b"MISSING_KEY"]
    assert [dict(m.headers())["idempotency-original-offset"] for m in letters[1:]] == [b"2", b"3"]
    assert "idempotency-error" not in dict(letters[1].headers())


def test_store_down_commits_nothing_loses_nothing_and_resumes(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [record({"i": i}, f"k{i}") for i in range(3)])
    store = FaultyStore(MemoryStore())
    store.fail("create", "create_many")
    seen = Seen()
    config = kafka_config(kafka_bootstrap)
    loop = KafkaConsumerLoop(make_consumer(store), config, topics=[topic], on_outcome=seen,
                             retry_backoff=(0.05, 0.2), maintenance=False)
    runs: list[int] = []
    with running(loop, lambda p: runs.append(p["i"])):
        wait_for(lambda: seen.kinds()["store_unavailable"] >= 4, 30, "repeated retries")
        assert committed(kafka_bootstrap, config["group.id"], topic) == [-1001]  # none
        assert runs == []
        # every retry is of the first message: nothing was skipped past it
        assert {m.offset for m, _ in seen.outcomes} == {0}
        store.heal()
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic) == [3], 30,
                 "all committed after the store came back")
    assert runs == [0, 1, 2]


def test_a_retried_partition_does_not_stall_the_others(kafka_bootstrap: str) -> None:
    """Partition 0's message is in progress elsewhere: partition 1 flows and is committed
    while partition 0 is paused, sought back and retried, never committed past."""
    topic = create_topic(kafka_bootstrap, partitions=2)
    consumer = make_consumer()
    handler = consumer.handler
    busy = handler._engine.prepare("orders.created", "acme", "busy", {"i": "busy"}, True)
    assert busy is not None
    claim = claimed(handler, busy)  # another worker holds this scope
    produce(kafka_bootstrap, topic, [
        {**record({"i": "busy"}, "busy"), "partition": 0},
        {**record({"i": "after"}, "after"), "partition": 0},
        *({**record({"i": n}, f"p1-{n}"), "partition": 1} for n in range(5)),
    ])
    seen = Seen()
    config = kafka_config(kafka_bootstrap)
    loop = KafkaConsumerLoop(consumer, config, topics=[topic], on_outcome=seen,
                             retry_backoff=(0.05, 0.1), maintenance=False)
    ran: list[Any] = []
    def body(payload: Any) -> str:
        ran.append(payload["i"])
        return "done"

    with running(loop, body):
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic, 2)[1] == 5, 30,
                 "partition 1 committed")
        wait_for(lambda: seen.kinds()["in_progress"] >= 3, 30, "partition 0 retried")
        assert committed(kafka_bootstrap, config["group.id"], topic, 2)[0] == -1001
        assert "after" not in ran  # ordering: nothing behind the waiting message ran
        assert completed(handler, busy, claim, "by-the-other-worker")
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic, 2) == [2, 5],
                 30, "partition 0 committed after the other worker finished")
    assert ran == [0, 1, 2, 3, 4, "after"]
    replays = [o for m, o in seen.outcomes if m.partition == 0 and o.kind == "replayed"]
    assert [o.result for o in replays] == ["by-the-other-worker"]


def test_config_guarantees() -> None:
    conf = consumer_config({"bootstrap.servers": "x:1", "group.id": "g"})
    assert conf["enable.auto.commit"] is False and conf["auto.offset.reset"] == "earliest"
    keep = consumer_config({"bootstrap.servers": "x:1", "group.id": "g",
                            "auto.offset.reset": "latest"})
    assert keep["auto.offset.reset"] == "latest"
    with pytest.raises(ConfigurationError):
        consumer_config({"bootstrap.servers": "x:1", "group.id": "g", "enable.auto.commit": True})
    with pytest.raises(ConfigurationError):
        consumer_config({"bootstrap.servers": "x:1"})
    with pytest.raises(ConfigurationError) as info:
        KafkaConsumerLoop(make_consumer(), {"bootstrap.servers": "x:1", "group.id": "g"},
                          topics=["t"], retry_backoff=(0, 1))
    assert info.value.code == ErrorCode.CONFIGURATION_ERROR


def test_a_retry_pending_through_an_eager_rebalance_is_consumed_again(
    kafka_bootstrap: str,
) -> None:
    """librdkafka keeps a partition's pause through an eager rebalance: a partition revoked
    while its retry was pending, then assigned back to the same consumer, must be resumed by
    the loop (it dropped the retry), or it is never consumed again.  A second member of the
    group subscribed to another topic forces the rebalance (range: every partition revoked,
    then all assigned back to the loop); the retry's own backoff is longer than the test."""
    topic, elsewhere = create_topic(kafka_bootstrap, partitions=2), create_topic(kafka_bootstrap)
    consumer = make_consumer()
    busy = consumer.handler._engine.prepare("orders.created", "acme", "busy", {"i": "busy"}, True)
    assert busy is not None
    claim = claimed(consumer.handler, busy)  # another worker holds this scope
    produce(kafka_bootstrap, topic, [{**record({"i": "busy"}, "busy"), "partition": 0},
                                     {**record({"i": "after"}, "after"), "partition": 0},
                                     {**record({"i": 1}, "p1"), "partition": 1}])
    seen = Seen()
    config = {**kafka_config(kafka_bootstrap), "partition.assignment.strategy": "range"}
    loop = KafkaConsumerLoop(consumer, config, topics=[topic], on_outcome=seen,
                             retry_backoff=(300, 300), maintenance=False)
    other = Consumer({**config, "enable.auto.commit": False})
    joined = threading.Event()
    with running(loop, lambda payload: payload["i"]):
        wait_for(lambda: seen.kinds()["in_progress"] == 1, 30, "partition 0 paused for a retry")
        wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic, 2) == [-1001, 1],
                 30, "partition 1 committed")
        assert completed(consumer.handler, busy, claim, "by-the-other-worker")
        other.subscribe([elsewhere], on_assign=lambda *_: joined.set())
        try:
            deadline = time.monotonic() + 30
            while not joined.is_set():  # the join is answered in the polls (Tansu: ~3 s)
                assert time.monotonic() < deadline, "the second member never joined"
                other.poll(0.2)
            wait_for(lambda: committed(kafka_bootstrap, config["group.id"], topic, 2) == [2, 1],
                     30, "partition 0 consumed again after the rebalance")
        finally:
            other.close()
    replays = [o for m, o in seen.outcomes if m.partition == 0 and o.kind == "replayed"]
    assert [o.result for o in replays] == ["by-the-other-worker"]
