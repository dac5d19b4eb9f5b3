"""Async actors (``async def``) through ``IdempotencyMiddleware`` with Dramatiq's ``AsyncIO``
middleware: the engine's native path on Dramatiq's event loop thread.

In-process: a Dramatiq ``Worker`` (real worker threads, the real event loop thread) on the
StubBroker, one test per row of the Dramatiq column.  Out of process: ``test_asyncio_worker``
runs ``dramatiq`` worker subprocesses on RabbitMQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.asyncio import EventLoopThread
from dramatiq.middleware import AsyncIO
from dramatiq.worker import WorkerThread

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    SQLStore,
    Status,
    current_context,
)
from idempotent_tasks.dramatiq import IdempotencyRetry, idempotent_actor
from tests._wait import wait_until as _wait_until

from .._services import REDIS_URL, require
from .conftest import Env, close_env, make_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def aenv() -> Iterator[Env]:
    e = make_env()
    e.broker.add_middleware(AsyncIO())
    yield e
    close_env(e)


def _send(actor: Any, *args: Any, key: str | None = "k-1") -> dramatiq.Message[Any]:
    options = {"idempotency_key": key, "tenant": "acme"} if key else {"tenant": "acme"}
    message: dramatiq.Message[Any] = actor.send_with_options(args=args, **options)
    return message


def test_async_actor_runs_inside_the_engine_on_the_loop_thread(aenv: Env) -> None:
    """The native path: the claim is made from Dramatiq's event loop (a sync store's call is
    off-loaded from it to a thread), never from the waiting Dramatiq worker thread, and the
    body is awaited on the loop thread inside the engine."""
    claimed_from: list[threading.Thread] = []
    aenv.store.before["create"] = lambda: claimed_from.append(threading.current_thread())
    seen: list[tuple[bool, int | None]] = []

    @idempotent_actor(store_results=True)
    async def charge(amount: int) -> dict[str, int]:
        ctx = current_context()
        on_loop = isinstance(threading.current_thread(), EventLoopThread)
        seen.append((on_loop, ctx.fencing_token if ctx else None))
        await asyncio.sleep(0)
        return {"charged": amount}

    aenv.start()
    first = _send(charge, 5)
    aenv.observer.wait_for(lambda ev: len(ev) == 1)
    again = _send(charge, 5)
    aenv.join()
    assert len(seen) == 1
    on_loop, token = seen[0]
    assert on_loop and token is not None
    assert claimed_from and not any(isinstance(t, WorkerThread) for t in claimed_from)
    assert [e.kind for e in aenv.observer.events] == ["done", "skipped"]
    assert aenv.backend.get_result(first) == {"charged": 5}  # type: ignore[no-untyped-call]
    assert aenv.backend.get_result(again) == {"charged": 5}  # type: ignore[no-untyped-call]


def test_in_progress_is_retried_uncounted_then_replayed(aenv: Env) -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    @idempotent_actor(min_backoff=20, max_backoff=50)
    async def slow(n: int) -> str:
        runs.append(n)
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        return "done"

    aenv.start(threads=2)
    _send(slow, 1)
    assert started.wait(20)
    _send(slow, 1)
    aenv.observer.wait_for(lambda ev: len(aenv.observer.errors("REQUEST_IN_PROGRESS")) >= 1)
    release.set()
    aenv.join()
    assert runs == [1]
    assert any(e.kind == "skipped" for e in aenv.observer.events)
    errors = aenv.observer.errors("REQUEST_IN_PROGRESS")
    assert all(isinstance(e.exception, IdempotencyRetry) for e in errors)
    assert aenv.handler.retry_count(operation="slow", tenant="acme", key="k-1") == 0


def test_transient_failure_is_retried_by_dramatiq_and_counted(aenv: Env) -> None:
    attempts: list[int] = []

    @idempotent_actor(min_backoff=20, max_backoff=50)
    async def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("downstream blinked")
        return len(attempts)

    aenv.start()
    _send(flaky)
    aenv.observer.wait_for(lambda ev: any(e.kind == "done" for e in ev))
    aenv.join()
    assert len(attempts) == 2
    assert aenv.handler.retry_count(operation="flaky", tenant="acme", key="k-1") == 1


def test_permanent_error_and_invalid_input_are_dead_lettered(aenv: Env) -> None:
    calls: list[int] = []

    @idempotent_actor(permanent=(ValueError,), min_backoff=20)
    async def strict(n: int) -> None:
        calls.append(n)
        raise ValueError("bad")

    aenv.start()
    poisoned = _send(strict, 1)
    missing = _send(strict, 2, key=None)
    aenv.join()
    assert calls == [1]
    assert sorted(aenv.dead_letter_ids()) == sorted([poisoned.message_id, missing.message_id])
    codes = {getattr(e.exception, "code", None) for e in aenv.observer.errors()}
    assert ErrorCode.MISSING_KEY in codes


def test_store_down_never_runs_the_body(aenv: Env) -> None:
    calls: list[int] = []

    @idempotent_actor(min_backoff=20, max_backoff=40)
    async def charge() -> None:
        calls.append(1)

    aenv.store.fail("*")
    aenv.start()
    _send(charge)
    aenv.observer.wait_for(lambda ev: len(aenv.observer.errors("STORE_UNAVAILABLE")) >= 2)
    assert calls == []
    aenv.store.heal()
    aenv.observer.wait_for(lambda ev: any(e.kind == "done" for e in ev))
    aenv.join()
    assert calls == [1]


def test_direct_call_runs_the_plain_coroutine(aenv: Env) -> None:
    @idempotent_actor
    async def double(n: int) -> int:
        assert current_context() is None
        return n * 2

    aenv.start()  # boots the AsyncIO event loop thread
    assert double(4) == 8


def test_without_the_asyncio_middleware_the_message_fails_loudly() -> None:
    e = make_env()
    try:
        @idempotent_actor(max_retries=1, min_backoff=10)
        async def lonely() -> None: ...

        e.start()
        _send(lonely)
        e.observer.wait_for(lambda ev: len(ev) >= 1)
        first = e.observer.events[0]
        assert isinstance(first.exception, ConfigurationError)
        assert "AsyncIO" in str(first.exception)
    finally:
        close_env(e)


def test_no_thread_hop_with_an_async_store() -> None:
    """With an async store the whole message runs on Dramatiq's event loop: no
    ``asyncio.to_thread``, executor or new thread while it is processed and replayed."""
    from dramatiq.brokers.stub import StubBroker

    from idempotent_tasks import AsyncRedisStore
    from idempotent_tasks.dramatiq import IdempotencyMiddleware

    from ..faststream._harness import no_thread_hop
    from .conftest import Observer

    require("redis")
    prefix = f"it_dqa_{uuid.uuid4().hex[:10]}"
    store = AsyncRedisStore(REDIS_URL, prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None)
    broker = StubBroker()
    broker.emit_after("process_boot")
    broker.add_middleware(IdempotencyMiddleware(handler, maintenance=False))
    broker.add_middleware(AsyncIO())
    observer = Observer()
    broker.add_middleware(observer)
    dramatiq.set_broker(broker)
    runs: list[int] = []

    @idempotent_actor
    async def charge(n: int) -> int:
        runs.append(n)
        return n

    worker = dramatiq.Worker(broker, worker_timeout=20, worker_threads=1)
    worker.start()
    try:
        with no_thread_hop():
            _send(charge, 1)
            observer.wait_for(lambda ev: len(ev) == 1)
            _send(charge, 1)
            observer.wait_for(lambda ev: len(ev) == 2)
    finally:
        worker.stop()
        broker.close()
        _drop_keys(prefix)
    assert [e.kind for e in observer.events] == ["done", "skipped"]
    assert runs == [1]


def _drop_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


# ---------------------------------------------------------------------- worker processes
@pytest.fixture
def rabbit_worker_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A vhost of our own, an SQLite store shared with the workers, the app's environment."""
    require("rabbitmq")
    vhost = f"it_dq_async_{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost)
    _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    SQLStore(store_url).create_schema()
    env = {**os.environ, "IT_BROKER_URL": f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
           "IT_QUEUE": f"q-{uuid.uuid4().hex[:8]}", "IT_STORE_URL": store_url,
           "IT_WORKDIR": str(tmp_path), "IT_LEASE": "2"}
    try:
        yield env
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, check=True, timeout=60)


class _Workers:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = (Path(self.env["IT_WORKDIR"]) / f"worker{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "tests.dramatiq.asyncio_app",
             "--processes", "1", "--threads", "2"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(20)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


def _lines(env: dict[str, str], name: str) -> list[str]:
    path = Path(env["IT_WORKDIR"]) / name
    return path.read_text().splitlines() if path.exists() else []


def _wait(condition: Any, timeout: float, what: str) -> None:
    _wait_until(condition, what, timeout, poll=0.05)  # the files the workers write


@pytest.mark.timeout(180)
def test_async_actor_in_a_killed_worker_is_taken_over_once(
    rabbit_worker_env: dict[str, str],
) -> None:
    """Real ``dramatiq`` worker processes: duplicates of an async actor run once, and a
    worker SIGKILLed while the body blocks *before* its effect is taken over by the next
    worker after the lease — exactly one effect, the crashed attempt counted."""
    env = rabbit_worker_env
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    sender = RabbitmqBroker(url=env["IT_BROKER_URL"])
    workers = _Workers(env)
    try:
        def send(actor: str, key: str, order: str) -> None:
            sender.enqueue(dramatiq.Message(
                queue_name=env["IT_QUEUE"], actor_name=actor, args=(order,), kwargs={},
                options={"idempotency_key": key, "tenant": "acme"}))

        first = workers.start()
        send("effect", "k-effect", "o-1")
        send("effect", "k-effect", "o-1")
        send("crashy", "k-crash", "o-2")
        _wait(lambda: (Path(env["IT_WORKDIR"]) / "started").exists(), 60, "the crashy body")
        _wait(lambda: _lines(env, "effects") == ["o-1"], 30, "the effect")
        workers.kill(first)
        workers.start()
        _wait(lambda: "o-2" in _lines(env, "effects"), 90, "the takeover")
        handler = IdempotencyHandler(SQLStore(env["IT_STORE_URL"]), metrics=None)
        _wait(lambda: (handler.get_record(operation="effect", tenant="acme", key="k-effect")
                       is not None), 30, "the effect's record")
    finally:
        workers.stop_all()
        sender.close()
    assert sorted(_lines(env, "effects")) == ["o-1", "o-2"]  # one effect each
    record = handler.get_record(operation="crashy", tenant="acme", key="k-crash")
    assert record is not None and record.status is Status.SUCCESS
    assert record.retry_count == 1  # the killed attempt was counted
    assert _lines(env, "attempts") == ["o-2 0", "o-2 1"]
