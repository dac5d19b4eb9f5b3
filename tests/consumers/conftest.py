"""Brokers for the consumer tests: a Tansu (Kafka-protocol) broker started per session on a
free port, and helpers for RabbitMQ queues that are deleted at teardown."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests._wait import wait_until as _wait_until

from .._services import RABBITMQ_URL, private_kafka, require


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a Tansu broker (memory storage) that lives for the session."""
    with private_kafka(tmp_path_factory.mktemp("tansu") / "tansu.log") as bootstrap:
        yield bootstrap


def create_topic(bootstrap: str, partitions: int = 1, prefix: str = "t") -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)]
    ).values():
        future.result(15)
    return name


def kafka_config(bootstrap: str, group: str | None = None) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group or f"g-{uuid.uuid4().hex[:10]}",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Each record: ``value`` (bytes), optional ``headers`` (dict), ``partition``, ``key``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for r in records:
        extra = {"partition": r["partition"]} if "partition" in r else {}
        producer.produce(
            topic, value=r["value"], key=r.get("key"),
            headers=list((r.get("headers") or {}).items()), **extra,
        )
    assert producer.flush(15) == 0


def read_all(bootstrap: str, topic: str, count: int, partition: int = 0,
             timeout: float = 20.0) -> list[Any]:
    """Read ``count`` messages of one partition from the start, without a group (assign)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-unused",
                       "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in reader.consume(count - len(got), 0.5):
                if m.error() is None:
                    got.append(m)
    finally:
        reader.close()
    return got


def committed(bootstrap: str, group: str, topic: str, partitions: int = 1) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "enable.auto.commit": False})
    try:
        tps = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in tps]
    finally:
        probe.close()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a condition that the code under test makes true (not a sleep that hopes)."""
    _wait_until(condition, what, timeout)


@pytest.fixture
def rabbit_queue() -> Iterator[str]:
    """A unique queue name; the queue, ``<queue>.dead``, ``<queue>.dlx`` are deleted after."""
    require("rabbitmq")
    from kombu import Connection  # type: ignore[attr-defined]

    name = f"it-{uuid.uuid4().hex[:10]}"
    yield name
    with Connection(RABBITMQ_URL) as conn:  # type: ignore[no-untyped-call]
        channel = conn.channel()
        for queue in (name, f"{name}.dead"):
            try:
                channel.queue_delete(queue)
            except Exception:
                channel = conn.channel()
        with contextlib.suppress(Exception):
            channel.exchange_delete(f"{name}.dlx")
