"""RabbitMQConsumerLoop against the real RabbitMQ (unique queues, deleted at teardown)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kombu as _kombu
import pytest

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, MemoryStore
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers.rabbitmq import RabbitMQConsumerLoop
from idempotent_tasks.testing import FaultyStore
from tests._claims import claimed, completed

from .._services import RABBITMQ_URL
from .conftest import wait_for

pytestmark = pytest.mark.rabbitmq
kombu: Any = _kombu  # partial annotations


class ValidationError(Exception):
    pass


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: list[tuple[Message, Outcome]] = []

    def __call__(self, message: Message, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append((message, outcome))

    def kinds(self) -> Counter[str]:
        with self.lock:
            return Counter(o.kind for _, o in self.outcomes)


def make_consumer(store: Any = None, **kwargs: Any) -> IdempotentConsumer:
    handler = IdempotencyHandler(store or MemoryStore(), metrics=None, lease_timeout=30,
                                 outcome_retry_timeout=0.1)
    kwargs.setdefault("default_tenant", "acme")
    return IdempotentConsumer(handler, operation="orders.created",
                              permanent=(ValidationError,), **kwargs)


@contextmanager
def running(loop: RabbitMQConsumerLoop, fn: Callable[..., Any]) -> Iterator[threading.Event]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            loop.run(fn, stop=stop)
        except BaseException as exc:
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


def publish(queue: str, items: list[tuple[Any, dict[str, Any]]]) -> None:
    with kombu.Connection(RABBITMQ_URL) as conn:
        producer = conn.Producer()
        for body, headers in items:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            producer.publish(raw, exchange="", routing_key=queue, headers=headers,
                             content_type="application/json", content_encoding="utf-8",
                             message_id=headers.get("mid"))


def ready(queue: str) -> int:
    """Messages ready in ``queue`` (passive declare: never creates it)."""
    with kombu.Connection(RABBITMQ_URL) as conn:
        _, count, _ = conn.channel().queue_declare(queue, passive=True)
        return int(count)


def drain(queue: str) -> list[Any]:
    got = []
    with kombu.Connection(RABBITMQ_URL) as conn:
        channel = conn.channel()
        while (m := channel.basic_get(queue, no_ack=True)) is not None:
            got.append(m)
    return got


def raw(message: Any) -> bytes:
    """py-amqp decodes a body whose content_encoding is utf-8; compare bytes."""
    body = message.body
    return body if isinstance(body, bytes) else body.encode("utf-8")


def test_declares_topology_idempotently(rabbit_queue: str) -> None:
    loop = RabbitMQConsumerLoop(make_consumer(), RABBITMQ_URL, queue=rabbit_queue)
    loop.declare()
    loop.declare()  # again: no error
    assert ready(rabbit_queue) == 0 and ready(f"{rabbit_queue}.dead") == 0
    with kombu.Connection(RABBITMQ_URL) as conn:  # the dead-letter exchange routes to .dead
        conn.Producer().publish(b"x", exchange=f"{rabbit_queue}.dlx", routing_key="any")
    wait_for(lambda: ready(f"{rabbit_queue}.dead") == 1, 10, "dlx → .dead")


def test_duplicates_are_replayed_and_all_acked(rabbit_queue: str) -> None:
    seen = Seen()
    loop = RabbitMQConsumerLoop(make_consumer(), RABBITMQ_URL, queue=rabbit_queue,
                                on_outcome=seen, maintenance=False)
    loop.declare()
    publish(rabbit_queue, [({"i": i % 3}, {"idempotency-key": f"k{i % 3}"}) for i in range(9)])
    runs: Counter[int] = Counter()

    def body(payload: Any) -> int:
        runs[payload["i"]] += 1
        return int(payload["i"]) + 100

    with running(loop, body):
        wait_for(lambda: sum(seen.kinds().values()) == 9, 20, "9 outcomes")
    assert runs == Counter({0: 1, 1: 1, 2: 1})
    assert seen.kinds() == Counter({"executed": 3, "replayed": 6})
    assert {o.result for _, o in seen.outcomes} == {100, 101, 102}
    assert all(m.topic == rabbit_queue and isinstance(m.offset, int) for m, _ in seen.outcomes)
    assert ready(rabbit_queue) == 0  # acked: nothing came back after the loop closed


def test_batch_mode(rabbit_queue: str) -> None:
    seen = Seen()
    loop = RabbitMQConsumerLoop(make_consumer(), RABBITMQ_URL, queue=rabbit_queue,
                                on_outcome=seen, maintenance=False, batch_size=10, prefetch=20)
    loop.declare()
    publish(rabbit_queue, [({"i": i % 10}, {"idempotency-key": f"k{i % 10}"})
                           for i in range(30)])
    runs: Counter[int] = Counter()
    with running(loop, lambda p: runs.update([p["i"]])):
        wait_for(lambda: sum(seen.kinds().values()) == 30, 20, "30 outcomes")
    assert runs == Counter(dict.fromkeys(range(10), 1))
    assert ready(rabbit_queue) == 0


def test_poison_and_rejected_are_dead_lettered_to_the_dead_queue(rabbit_queue: str) -> None:
    seen = Seen()
    loop = RabbitMQConsumerLoop(make_consumer(), RABBITMQ_URL, queue=rabbit_queue,
                                on_outcome=seen, maintenance=False)
    loop.declare()
    publish(rabbit_queue, [
        ({"bad": True}, {"idempotency-key": "p1", "trace": "abc", "mid": "m-1"}),
        ({"ok": 1}, {"idempotency-key": "g1"}),
        (b"{not json", {"idempotency-key": "r1"}),
    ])

    def body(payload: Any) -> str:
        if payload.get("bad"):
            raise ValidationError("nope")
        return "ok"

    with running(loop, body):
        wait_for(lambda: ready(f"{rabbit_queue}.dead") == 2, 20, "two dead letters")
    assert [o.kind for _, o in seen.outcomes] == ["poisoned", "executed", "rejected"]
    assert ready(rabbit_queue) == 0
    letters = drain(f"{rabbit_queue}.dead")
    poisoned, rejected = letters
    h = poisoned.headers
    assert h["idempotency-error-code"] == "REQUEST_FAILED"
    assert h["idempotency-error"] == "ValidationError"
    assert h["idempotency-original-topic"] == rabbit_queue
    assert h["idempotency-original-offset"].isdigit()
    assert h["trace"] == "abc" and h["idempotency-key"] == "p1"
    assert raw(poisoned) == json.dumps({"bad": True}).encode()
    assert poisoned.properties.get("message_id") == "m-1"
    assert rejected.headers["idempotency-error-code"] == "INVALID_PAYLOAD"
    assert raw(rejected) == b"{not json"


def test_store_down_acks_nothing_and_processes_after_heal(rabbit_queue: str) -> None:
    store = FaultyStore(MemoryStore())
    store.fail("create", "create_many")
    seen = Seen()
    consumer = make_consumer(store)
    loop = RabbitMQConsumerLoop(consumer, RABBITMQ_URL, queue=rabbit_queue, on_outcome=seen,
                                retry_backoff=(0.05, 0.2), maintenance=False)
    loop.declare()
    publish(rabbit_queue, [({"i": i}, {"idempotency-key": f"k{i}"}) for i in range(3)])
    runs: list[int] = []
    with running(loop, lambda p: runs.append(p["i"])):
        wait_for(lambda: seen.kinds()["store_unavailable"] >= 9, 20, "repeated retries")
    # the loop stopped while the store was down: every message is back in the queue
    assert runs == [] and ready(rabbit_queue) == 3
    store.heal()
    seen2 = Seen()
    loop2 = RabbitMQConsumerLoop(consumer, RABBITMQ_URL, queue=rabbit_queue, on_outcome=seen2,
                                 retry_backoff=(0.05, 0.2), maintenance=False)
    store.fail("create", "create_many")
    with running(loop2, lambda p: runs.append(p["i"])):
        wait_for(lambda: seen2.kinds()["store_unavailable"] >= 3, 20, "down again")
        store.heal()  # heals while running: the held messages come back and run
        wait_for(lambda: seen2.kinds()["executed"] == 3, 20, "processed after heal")
    assert sorted(runs) == [0, 1, 2] and ready(rabbit_queue) == 0


def test_in_progress_message_is_held_without_blocking_others(rabbit_queue: str) -> None:
    consumer = make_consumer()
    handler = consumer.handler
    busy = handler._engine.prepare("orders.created", "acme", "busy", {"i": "busy"}, True)
    assert busy is not None
    claim = claimed(handler, busy)
    seen = Seen()
    loop = RabbitMQConsumerLoop(consumer, RABBITMQ_URL, queue=rabbit_queue, on_outcome=seen,
                                retry_backoff=(0.1, 0.2), maintenance=False)
    loop.declare()
    publish(rabbit_queue, [({"i": "busy"}, {"idempotency-key": "busy"})]
            + [({"i": n}, {"idempotency-key": f"n{n}"}) for n in range(5)])
    ran: list[Any] = []
    def body(payload: Any) -> str:
        ran.append(payload["i"])
        return "mine"

    with running(loop, body):
        wait_for(lambda: seen.kinds()["executed"] == 5, 20, "others processed")
        wait_for(lambda: seen.kinds()["in_progress"] >= 2, 20, "busy retried")
        assert completed(handler, busy, claim, "theirs")
        wait_for(lambda: seen.kinds()["replayed"] == 1, 20, "busy replayed")
    assert ran == [0, 1, 2, 3, 4]
    assert [o.result for _, o in seen.outcomes if o.kind == "replayed"] == ["theirs"]


def test_conflicting_existing_queue_is_reported_clearly(rabbit_queue: str) -> None:
    with kombu.Connection(RABBITMQ_URL) as conn:
        conn.channel().queue_declare(rabbit_queue, durable=True, auto_delete=False,
                                     arguments={"x-max-length": 10})
    loop = RabbitMQConsumerLoop(make_consumer(), RABBITMQ_URL, queue=rabbit_queue)
    with pytest.raises(IdempotencyError) as info:
        loop.declare()
    err = info.value
    assert err.code == ErrorCode.CONFIGURATION_ERROR
    assert rabbit_queue in err.message and "x-dead-letter-exchange" in err.message
    with pytest.raises(IdempotencyError) as again:  # run() reports it too, without looping
        loop.run(lambda p: p, stop=threading.Event())
    assert again.value.code == ErrorCode.CONFIGURATION_ERROR
