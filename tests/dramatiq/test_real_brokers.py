"""Real RabbitMQ and Redis brokers with ``dramatiq`` worker subprocesses.

The store is an SQLite file shared by the test and every worker process (the SQL store is
multi-process safe).  Each test has its own queue / namespace / tables and kills every worker
process group at teardown.  A crash is a SIGKILL of the whole worker process group while the
body blocks *before* its effect (docs/guarantees.md): the broker redelivers the message (RabbitMQ on
connection loss; Redis once the dead worker's heartbeat is older than ``heartbeat_timeout``),
the new worker finds the scope PROCESSING, retries uncounted until the 2 s lease expires, then
takes it over (counted) — exactly one effect, ``retry_count == 1``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from idempotent_tasks import IdempotencyHandler, SQLStore, Status

from .._services import RABBITMQ_URL as _AMQP_URL
from .._services import REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
# pika reads the default vhost "/" only when it is URL-encoded.
RABBITMQ_URL = _AMQP_URL[:-2] + "/%2F" if _AMQP_URL.endswith("//") else _AMQP_URL
REDIS_DB_URL = REDIS_URL.rsplit("/", 1)[0] + "/3"


@dataclass
class Cluster:
    kind: str
    queue: str
    workdir: Path
    env: dict[str, str]
    handler: IdempotencyHandler
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_worker(self) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"worker{len(self.workers)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "tests.dramatiq.worker_app",
             "--processes", "1", "--threads", "2"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def send(self, actor: str, *args: Any, **options: Any) -> str:
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.queue, actor_name=actor, args=args, kwargs={}, options=options
        )
        broker = self.producer()
        try:
            broker.declare_queue(self.queue)
            broker.enqueue(message)
        finally:
            broker.close()
        return message.message_id

    def producer(self) -> dramatiq.Broker:
        if self.kind == "rabbitmq":
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            return RabbitmqBroker(url=RABBITMQ_URL, middleware=[])
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(  # type: ignore[no-untyped-call]
            url=REDIS_DB_URL, namespace=f"dq-{self.queue}", middleware=[]
        )

    def dead_letters(self) -> int:
        if self.kind == "rabbitmq":
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            rb = RabbitmqBroker(url=RABBITMQ_URL, middleware=[])
            try:
                return rb.get_queue_message_counts(self.queue)[2]
            finally:
                rb.close()
        import redis

        client = redis.Redis.from_url(REDIS_DB_URL)
        try:
            return int(client.hlen(f"dq-{self.queue}:{self.queue}.XQ.msgs"))
        finally:
            client.close()

    def lines(self, name: str) -> list[str]:
        path = self.workdir / name
        return path.read_text().splitlines() if path.exists() else []

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait for a state another *process* produces (files, store rows), bounded."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-3000:] for p in self.workdir.glob("worker*.log"))
                raise AssertionError(f"timed out waiting for {what}\n{logs}")
            for proc in self.workers:
                assert proc.poll() is None or proc.returncode == -signal.SIGKILL, "worker died"
            time.sleep(0.05)

    def record(self, operation: str, key: str) -> Any:
        return self.handler.get_record(operation=operation, tenant="acme", key=key)


@pytest.fixture(params=["rabbitmq", "redis"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    kind: str = request.param
    require(kind)
    queue = f"it_{uuid.uuid4().hex[:10]}"
    prefix = f"dq_{uuid.uuid4().hex[:8]}"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SQLStore(store_url, table_prefix=prefix)
    store.create_schema()
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "IT_BROKER": kind,
        "IT_BROKER_URL": RABBITMQ_URL if kind == "rabbitmq" else REDIS_DB_URL,
        "IT_QUEUE": queue, "IT_STORE_URL": store_url, "IT_TABLE_PREFIX": prefix,
        "IT_WORKDIR": str(tmp_path), "IT_LEASE": "2",
    }
    c = Cluster(kind, queue, tmp_path, env, IdempotencyHandler(store, metrics=None))
    try:
        yield c
    finally:
        for proc in c.workers:
            c.kill(proc)
        _delete_queues(c)
        store.close()


def _delete_queues(c: Cluster) -> None:
    if c.kind == "rabbitmq":
        import pika  # type: ignore[import-untyped]

        conn = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        try:
            ch = conn.channel()
            for suffix in ("", ".DQ", ".XQ"):
                ch.queue_delete(c.queue + suffix)
        finally:
            conn.close()
        return
    import redis

    client = redis.Redis.from_url(REDIS_DB_URL)
    try:
        keys = list(client.scan_iter(f"dq-{c.queue}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_worker_killed_mid_body_is_taken_over_after_the_lease(cluster: Cluster) -> None:
    first = cluster.start_worker()
    cluster.send("crashy", "o-1", idempotency_key="crash-1", tenant="acme")
    cluster.wait("the body to start", lambda: (cluster.workdir / "started").exists())
    cluster.kill(first)  # SIGKILL the whole worker process group, mid-body
    assert cluster.lines("effects") == []
    cluster.start_worker()
    cluster.wait("the takeover to finish", lambda: getattr(
        cluster.record("crashy", "crash-1"), "status", None) is Status.SUCCESS)

    assert cluster.lines("effects") == ["o-1"]  # exactly one completed effect
    assert len(cluster.lines("attempts")) == 2
    record = cluster.record("crashy", "crash-1")
    assert record.retry_count == 1 and record.response == "o-1"


def test_duplicates_replayed_and_poison_dead_lettered(cluster: Cluster) -> None:
    cluster.start_worker()
    for _ in range(3):
        cluster.send("effect", "e-1", idempotency_key="dup-1", tenant="acme")
    cluster.send("effect", "e-2", idempotency_key="dup-1", tenant="globex")
    cluster.send("always_fails", "f-1", idempotency_key="poison-1", tenant="acme")
    cluster.wait("the poisoned message in the DLQ", lambda: cluster.dead_letters() == 1)
    cluster.wait("both tenants' effects", lambda: len(cluster.lines("effects")) >= 2)

    assert sorted(cluster.lines("effects")) == ["e-1", "e-2"]
    assert cluster.lines("failures") == ["f-1", "f-1"]  # max_retries=2 runs, then poisoned
    record = cluster.record("always_fails", "poison-1")
    assert record.status is Status.FAILED and record.retry_count == 2
