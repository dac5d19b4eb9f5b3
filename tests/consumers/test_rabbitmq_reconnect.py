"""RabbitMQConsumerLoop when its broker connection dies mid-delivery (real RabbitMQ).

The loop consumes a queue of twenty messages in a vhost of the test's own.  The body of one
message blocks; while it runs, the connection is killed — by the broker
(``rabbitmqctl close_connection``, verified: the connection is closing or gone) or by the
network (a TCP proxy aborts it with a reset, verified: no connection left open).  Then the
body is let go: it finishes and its SUCCESS is recorded, but its ack cannot reach the broker,
which requeues everything the dead connection held.  The loop must reconnect (verified: a
new connection), get the message again and *replay* it (no second effect), and consume the
rest: nothing lost, nothing run twice, the queue empty at the end.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kombu as _kombu
import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers.rabbitmq import RabbitMQConsumerLoop

from ._reconnect import ConnectionKiller, Vhost, wait_until

pytestmark = pytest.mark.rabbitmq
kombu: Any = _kombu  # partial annotations
MESSAGES = 20
GATED = "k-5"


@pytest.fixture(scope="module")
def vhost() -> Iterator[Vhost]:
    v = Vhost()
    yield v
    v.delete()


class Effects:
    """The body's effects and the loop's decisions, shared with the loop's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.outcomes: list[tuple[str | None, str]] = []
        self.inside = threading.Event()
        self.release = threading.Event()

    def body(self, payload: dict[str, Any]) -> str:
        key = payload["key"]
        if key == GATED and not self.inside.is_set():
            self.inside.set()
            assert self.release.wait(60), "the test never let the body go"
        with self.lock:
            self.counts[key] += 1
        return str(key)

    def on_outcome(self, message: Message, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append((outcome.key, outcome.kind))

    def kinds(self, key: str) -> list[str]:
        with self.lock:
            return [kind for k, kind in self.outcomes if k == key]


@contextmanager
def running(loop: RabbitMQConsumerLoop, fn: Callable[..., Any]) -> Iterator[None]:
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
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the loop did not stop"
    if errors:
        raise errors[0]


@contextmanager
def released(effects: Effects) -> Iterator[None]:
    """Let the gated body go on the way out, whatever failed (the loop must stop)."""
    try:
        yield
    finally:
        effects.release.set()


def publish(url: str, queue: str, keys: list[str]) -> None:
    with kombu.Connection(url) as conn:
        producer = conn.Producer()
        for key in keys:
            producer.publish(json.dumps({"key": key}).encode(), exchange="", routing_key=queue,
                             headers={"idempotency-key": key}, content_type="application/json",
                             content_encoding="utf-8", delivery_mode=2)


def queued(url: str, queue: str) -> int:
    """Messages in ``queue`` that are ready (unacked ones come back when their channel dies)."""
    with kombu.Connection(url) as conn:
        _, count, _ = conn.channel().queue_declare(queue, passive=True)
        return int(count)


def delete_queue(url: str, queue: str) -> None:
    with kombu.Connection(url) as conn:
        channel = conn.channel()
        for name in (queue, f"{queue}.dead"):
            channel.queue_delete(name)
        channel.exchange_delete(f"{queue}.dlx")


@pytest.mark.parametrize("fault", ["close_connection", "tcp_reset"])
def test_reconnect_when_the_connection_dies_mid_delivery(vhost: Vhost, fault: str) -> None:
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    killer = ConnectionKiller(fault, vhost)
    effects = Effects()
    handler = IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=30)
    consumer = IdempotentConsumer(handler, operation="orders.created", default_tenant="acme")
    loop = RabbitMQConsumerLoop(consumer, killer.url(), queue=queue, retry_backoff=(0.1, 0.5),
                                maintenance=False, on_outcome=effects.on_outcome, prefetch=8)
    loop.declare()
    keys = [f"k-{i}" for i in range(MESSAGES)]
    publish(vhost.url(), queue, keys)
    try:
        with running(loop, effects.body), released(effects):
            assert effects.inside.wait(30), "the gated body never started"
            assert killer.kill() == 1  # the loop's one connection, mid-delivery
            effects.release.set()  # the body finishes; its ack cannot reach the broker
            wait_until(lambda: set(effects.counts) == set(keys)
                       and "replayed" in effects.kinds(GATED), "the redelivery and the rest")
            wait_until(killer.reconnected, "the loop to reconnect")
        assert effects.counts == Counter(dict.fromkeys(keys, 1))  # nothing lost or run twice
        assert effects.kinds(GATED)[:2] == ["executed", "replayed"]
        assert queued(vhost.url(), queue) == 0  # every message was acked
    finally:
        killer.close()
        delete_queue(vhost.url(), queue)
