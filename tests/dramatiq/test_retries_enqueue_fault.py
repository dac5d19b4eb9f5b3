"""The broker connection drops exactly while Dramatiq's Retries re-enqueues a failed message.

Dramatiq acks the original right after Retries' ``after_process_message``, even when the
re-enqueue raised (``emit_after`` only logs it): the message would be gone.  The integration
must not let that ack through until the retry is enqueued (``_retry_guard``).  A real worker
subprocess talks to the real broker through a :class:`~tests._proxy.TCPProxy`; the worker's
``Moment`` middleware (``retry_fault_app.py``) holds the retry's publish until the test has
broken the link:

* **Redis** — the broker is down: every connection is dropped and new ones are refused, so
  the re-enqueue fails; Dramatiq would retry the *ack* until Redis is back, then ack.
* **RabbitMQ** — the worker's publishing connection is dropped and new connections are
  refused, while the consumer's connection (the one that carries acks) lives on: the
  re-enqueue fails after Dramatiq's six attempts, and the ack would go through at once.

Either way the message must come back: once the link is restored, the retry is enqueued, the
second attempt runs, and the scope ends SUCCESS with two attempts and one counted retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import MiddlewareError

from idempotent_tasks import IdempotencyHandler, MemoryStore, SQLStore, Status
from idempotent_tasks.dramatiq import IdempotencyMiddleware
from idempotent_tasks.dramatiq._retry_guard import RetryGuard, RetryNotEnqueuedError

from .._proxy import TCPProxy
from .._services import REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
PORTS = {"rabbitmq": 5672, "redis": 6379}
REDIS_DB = 3
OPERATION = "charge"


class CuttingProxy(TCPProxy):
    """A proxy that can drop *some* connections and refuse new ones."""

    def established(self) -> set[asyncio.BaseTransport]:
        return self._call(self._snapshot())

    def cut(self, keep: set[asyncio.BaseTransport]) -> int:
        """Refuse new connections and abort every open one not in ``keep``; returns how many
        were aborted."""
        return self._call(self._cut(keep))

    async def _snapshot(self) -> set[asyncio.BaseTransport]:
        return set(self._transports)

    async def _cut(self, keep: set[asyncio.BaseTransport]) -> int:
        self._down = True
        doomed = [t for t in self._transports if t not in keep]
        for transport in doomed:
            transport.abort()
        return len(doomed)


@dataclass
class Run:
    kind: str
    queue: str
    workdir: Path
    handler: IdempotencyHandler
    proxy: CuttingProxy
    worker: subprocess.Popen[bytes] | None = None

    def broker_url(self, port: int) -> str:
        if self.kind == "rabbitmq":
            return f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        return f"redis://127.0.0.1:{port}/{REDIS_DB}"

    def start_worker(self, store_url: str, prefix: str) -> None:
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "IT_BROKER": self.kind,
            "IT_BROKER_URL": self.broker_url(self.proxy.port), "IT_QUEUE": self.queue,
            "IT_STORE_URL": store_url, "IT_TABLE_PREFIX": prefix, "IT_WORKDIR": str(self.workdir),
        }
        with (self.workdir / "worker.log").open("wb") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", "tests.dramatiq.retry_fault_app",
                 "--processes", "1", "--threads", "1"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def producer(self) -> dramatiq.Broker:
        """A broker connected to the real server directly (not through the proxy)."""
        url = self.broker_url(PORTS[self.kind])
        if self.kind == "rabbitmq":
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            return RabbitmqBroker(url=url, middleware=[], confirm_delivery=True)
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, namespace=f"dq-{self.queue}", middleware=[])  # type: ignore[no-untyped-call]

    def send(self, key: str) -> None:
        broker = self.producer()
        try:
            broker.declare_queue(self.queue)
            broker.enqueue(dramatiq.Message(
                queue_name=self.queue, actor_name="charge", args=("o-1",), kwargs={},
                options={"idempotency_key": key, "tenant": "acme"},
            ))
        finally:
            broker.close()

    def log(self) -> str:
        path = self.workdir / "worker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait for a state the worker process produces (files, log lines, store rows)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.log()[-4000:]}")
            assert self.worker is not None and self.worker.poll() is None, self.log()[-4000:]
            time.sleep(0.05)

    def record(self, key: str) -> Any:
        return self.handler.get_record(operation=OPERATION, tenant="acme", key=key)

    def cleanup(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait(10)
        if self.kind == "rabbitmq":
            import pika  # type: ignore[import-untyped]

            conn = pika.BlockingConnection(pika.URLParameters(self.broker_url(5672)))
            try:
                channel = conn.channel()
                for suffix in ("", ".DQ", ".XQ"):
                    channel.queue_delete(self.queue + suffix)
            finally:
                conn.close()
            return
        import redis

        with redis.Redis.from_url(self.broker_url(6379)) as client:
            keys = list(client.scan_iter(f"dq-{self.queue}:*"))
            if keys:
                client.delete(*keys)


@pytest.fixture(params=["rabbitmq", "redis"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    kind: str = request.param
    require(kind)
    assert REDIS_URL.startswith("redis://127.0.0.1:6379")  # the proxy's target below
    prefix = f"rf_{uuid.uuid4().hex[:8]}"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SQLStore(store_url, table_prefix=prefix)
    store.create_schema()
    proxy = CuttingProxy(PORTS[kind]).start()
    r = Run(kind, f"rf_{uuid.uuid4().hex[:10]}", tmp_path, IdempotencyHandler(store, metrics=None),
            proxy)
    r.start_worker(store_url, prefix)
    try:
        yield r
    finally:
        proxy.stop()
        r.cleanup()
        store.close()


def test_retry_enqueue_failing_at_a_connection_drop_does_not_lose_the_message(run: Run) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    run.send(key)
    run.wait("the first attempt", lambda: (run.workdir / "attempt-1").exists())
    consumer_links = run.proxy.established()  # the consumer's connections, before any publish
    (run.workdir / "go").touch()
    run.wait("Retries to start the re-enqueue", lambda: (run.workdir / "retrying").exists())

    keep = consumer_links if run.kind == "rabbitmq" else set()
    assert run.proxy.cut(keep) >= 1, "no connection was dropped: the fault did not happen"
    accepted = run.proxy.accepted
    (run.workdir / "dropped").touch()
    run.wait("Retries' re-enqueue to fail",
             lambda: "Unexpected failure in after_process_message" in run.log())
    assert run.proxy.accepted > accepted, "the worker never tried to reconnect"
    if run.kind == "rabbitmq":
        assert keep <= run.proxy.established(), "the consumer's connection was dropped too"
    record = run.record(key)
    assert record is None or record.status is not Status.SUCCESS

    run.proxy.forward()  # the broker is reachable again
    run.wait("the retried message to succeed",
             lambda: (rec := run.record(key)) is not None and rec.status is Status.SUCCESS)
    record = run.record(key)
    assert record.response == "charged o-1" and record.retry_count == 1
    assert (run.workdir / "attempts").read_text().splitlines() == ["o-1", "o-1"]
    assert "dramatiq_retry_reenqueued" in run.log()


# -- the guard's edges, without a broker process ----------------------------------------------
@dataclass
class _Message:
    message_id: str


class _DownBroker:
    """Every enqueue fails, as with a broker that is down; the first failure is signalled."""

    def __init__(self) -> None:
        self.failed = threading.Event()
        self.attempts = 0

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        self.attempts += 1
        self.failed.set()
        raise ConnectionError("broker down")


def test_a_worker_shutting_down_leaves_the_original_unacked() -> None:
    """The guard never acks without the retry: at shutdown it gives up by raising from
    ``before_ack`` (a ``MiddlewareError``, which makes Dramatiq skip the ack)."""
    guard = RetryGuard(IdempotencyHandler(MemoryStore(), metrics=None).log)
    message, broker = _Message("m-1"), _DownBroker()
    errors: list[BaseException] = []

    def ack() -> None:
        guard.expect_retry(message)  # thread-local: the worker thread's own pending retry
        guard.enqueue_started(message, 500)
        try:
            guard.before_ack(broker, message)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=ack)
    thread.start()
    assert broker.failed.wait(10)
    guard.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RetryNotEnqueuedError)
    assert isinstance(errors[0], MiddlewareError)
    assert broker.attempts >= 1


def test_an_enqueued_retry_or_a_nack_needs_nothing_more() -> None:
    guard = RetryGuard(IdempotencyHandler(MemoryStore(), metrics=None).log)
    broker = _DownBroker()
    done, failed = _Message("m-done"), _Message("m-failed")
    guard.expect_retry(done)
    guard.enqueue_started(done, 100)
    guard.enqueue_done(done, 100)
    guard.before_ack(broker, done)  # the retry is in the broker: the ack goes through
    guard.expect_retry(failed)
    guard.forget(failed)  # dead-lettered: no retry owed
    guard.before_ack(broker, failed)
    guard.before_ack(broker, _Message("never-failed"))
    assert broker.attempts == 0


def test_a_rabbitmq_worker_publishes_with_confirms() -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:5672/%2F")
    assert broker.confirm_delivery is False
    broker.add_middleware(IdempotencyMiddleware(IdempotencyHandler(MemoryStore(), metrics=None)))
    for middleware in broker.middleware:
        if isinstance(middleware, IdempotencyMiddleware):
            middleware.before_worker_boot(broker, None)
    assert broker.confirm_delivery is True
