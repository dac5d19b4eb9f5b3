"""The Dramatiq part of ``idempotent-tasks demo``: real deliveries through a real worker.

Everything runs in this process — a ``StubBroker`` and a real ``dramatiq.Worker`` with the
:class:`~idempotent_tasks.dramatiq.IdempotencyMiddleware` and in-worker maintenance — against
the given store (the demo passes an SQLite file), so no server is needed.  Each scenario
reports how many messages were delivered, how many times the body really ran, and whether
that is what docs/guarantees.md promises.  Keys are unique per run, so the demo can be re-run on
the same store.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware

from .._core.handler import IdempotencyHandler
from .._core.metrics import Metrics
from .._core.records import Status
from ..dramatiq import IdempotencyMiddleware, IdempotencyRetry, idempotent_actor
from ..stores.urls import store_from_url
from ..testing import simulate_crash
from ._report import ScenarioLine

INTEGRATION = "dramatiq"
TENANT = "demo"
#: The actors' names, which are their records' operations (what the store stats list).
OPERATIONS = {name: f"demo.dramatiq.{name}" for name in
              ("charge", "slow", "reject", "flaky", "crash")}
QUEUE = "idempotency_demo"
_FAST: dict[str, Any] = {"min_backoff": 20, "max_backoff": 100, "queue_name": QUEUE}


class _Rejected(Exception):
    """The demo's permanent business error."""


@dataclass
class _Watch(Middleware):
    """Counts in-progress retries so a scenario can *wait* for them (no sleeps)."""

    in_progress: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if isinstance(exception, IdempotencyRetry) and exception.code == "REQUEST_IN_PROGRESS":
            with self.cond:
                self.in_progress += 1
                self.cond.notify_all()

    def wait_in_progress(self, count: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.in_progress >= count, timeout)


@dataclass
class _Demo:
    handler: IdempotencyHandler
    broker: StubBroker
    watch: _Watch
    run_id: str
    runs: dict[str, int] = field(default_factory=dict)

    def key(self, name: str) -> str:
        return f"{name}-{self.run_id}"

    def ran(self, name: str) -> None:
        self.runs[name] = self.runs.get(name, 0) + 1

    def join(self, worker: dramatiq.Worker) -> None:
        self.broker.join(QUEUE, fail_fast=False, timeout=10_000)
        worker.join()

    def record_fields(self, operation: str, key: str) -> dict[str, object]:
        record = self.handler.get_record(operation=operation, tenant=TENANT, key=key)
        if record is None:
            return {"status": None}
        return {"status": record.status.value, "retry_count": record.retry_count}


def run_scenario(
    store_url: str, workdir: Path, *, metrics: Metrics | None = None, prefix: str | None = None
) -> list[ScenarioLine]:
    """Run the five Dramatiq scenarios on ``store_url`` (any store URL the workers can
    share); one :class:`ScenarioLine` each.  ``metrics``: where the handler records (none
    when omitted); ``prefix``: the store's table / key prefix."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = store_from_url(store_url, prefix=prefix)
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=metrics)
    try:
        with _quiet_dramatiq_logs():
            return _run(handler)
    finally:
        handler.close()
        store.close()


def _run(handler: IdempotencyHandler) -> list[ScenarioLine]:
    broker = StubBroker()
    broker.emit_after("process_boot")
    middleware = IdempotencyMiddleware(
        handler, default_tenant=TENANT, recover_every=0.2, cleanup_every=60
    )
    broker.add_middleware(middleware)
    watch = _Watch()
    broker.add_middleware(watch)
    demo = _Demo(handler, broker, watch, uuid.uuid4().hex[:8])
    scenarios = _declare(demo)
    worker = dramatiq.Worker(broker, worker_timeout=20, worker_threads=4)
    worker.start()
    try:
        return [scenario(worker) for scenario in scenarios]
    finally:
        worker.stop()
        broker.close()


def _declare(demo: _Demo) -> list[Callable[[dramatiq.Worker], ScenarioLine]]:
    """Declare the demo's actors and return one scenario function per line."""
    b = demo.broker
    release = threading.Event()

    @idempotent_actor(actor_name=OPERATIONS["charge"], broker=b, **_FAST)
    def charge(order_id: str, amount: int) -> dict[str, object]:
        demo.ran("charge")
        return {"order": order_id, "charged": amount}

    @idempotent_actor(actor_name=OPERATIONS["slow"], broker=b, **_FAST)
    def slow(order_id: str) -> str:
        demo.ran("slow")
        release.wait(5)
        return order_id

    @idempotent_actor(actor_name=OPERATIONS["reject"], broker=b, permanent=(_Rejected,), **_FAST)
    def reject(order_id: str) -> None:
        demo.ran("reject")
        raise _Rejected(f"order {order_id} is invalid")

    @idempotent_actor(actor_name=OPERATIONS["flaky"], broker=b, max_retries=3, **_FAST)
    def flaky(order_id: str) -> None:
        demo.ran("flaky")
        raise ConnectionError("the payment gateway timed out")

    @idempotent_actor(actor_name=OPERATIONS["crash"], broker=b, lease_timeout=0.5, **_FAST)
    def crash(order_id: str) -> str:
        demo.ran("crash")
        return order_id

    return [
        lambda w: _duplicates(demo, w, charge),
        lambda w: _concurrent(demo, w, slow, release),
        lambda w: _permanent(demo, w, reject),
        lambda w: _flaky(demo, w, flaky),
        lambda w: _crash(demo, w, crash),
    ]


def _duplicates(demo: _Demo, w: dramatiq.Worker, actor: dramatiq.Actor[Any, Any]) -> ScenarioLine:
    key = demo.key("dup")
    first = actor.send_with_options(args=("o-1", 100), idempotency_key=key)
    demo.join(w)
    demo.broker.enqueue(first)  # the broker redelivers the same message
    for _ in range(2):  # the producer retries with the same key
        actor.send_with_options(args=("o-1", 100), idempotency_key=key)
    demo.join(w)
    runs = demo.runs.get("charge", 0)
    fields = demo.record_fields(OPERATIONS["charge"], key)
    return ScenarioLine(
        INTEGRATION, "duplicate deliveries", 4, runs, "ran once, replayed 3 times",
        runs == 1 and fields["status"] == Status.SUCCESS.value, fields,
    )


def _concurrent(
    demo: _Demo, w: dramatiq.Worker, actor: dramatiq.Actor[Any, Any], release: threading.Event
) -> ScenarioLine:
    key = demo.key("concurrent")
    for _ in range(3):
        actor.send_with_options(args=("o-2",), idempotency_key=key)
    forced = demo.watch.wait_in_progress(2, timeout=5)  # both duplicates saw PROCESSING
    release.set()
    demo.join(w)
    runs = demo.runs.get("slow", 0)
    fields = {**demo.record_fields(OPERATIONS["slow"], key),
              "in_progress_retries": demo.watch.in_progress}
    return ScenarioLine(
        INTEGRATION, "concurrent duplicates", 3, runs,
        "ran once; duplicates retried while it ran, then replayed",
        forced and runs == 1 and fields["status"] == Status.SUCCESS.value, fields,
    )


def _permanent(demo: _Demo, w: dramatiq.Worker, actor: dramatiq.Actor[Any, Any]) -> ScenarioLine:
    key = demo.key("permanent")
    message = actor.send_with_options(args=("o-3",), idempotency_key=key)
    demo.join(w)
    demo.broker.enqueue(message)  # redelivered: refused, never re-run
    demo.join(w)
    runs = demo.runs.get("reject", 0)
    fields = demo.record_fields(OPERATIONS["reject"], key)
    dead = sum(1 for m in demo.broker.dead_letters if m.message_id == message.message_id)
    return ScenarioLine(
        INTEGRATION, "permanent failure", 2, runs, "poisoned at once, dead-lettered",
        runs == 1 and dead == 2 and fields["status"] == Status.FAILED.value,
        {**fields, "dead_lettered": dead},
    )


def _flaky(demo: _Demo, w: dramatiq.Worker, actor: dramatiq.Actor[Any, Any]) -> ScenarioLine:
    key = demo.key("flaky")
    message = actor.send_with_options(args=("o-4",), idempotency_key=key)
    demo.join(w)
    runs = demo.runs.get("flaky", 0)
    fields = demo.record_fields(OPERATIONS["flaky"], key)
    dead = any(m.message_id == message.message_id for m in demo.broker.dead_letters)
    return ScenarioLine(
        INTEGRATION, "flaky actor", 1, runs,
        "ran 3x for 1 message: Dramatiq's Retries re-sent each transient error until the "
        "store had counted 3; dead-lettered",
        runs == 3 and dead and fields["status"] == Status.FAILED.value, fields,
    )


def _crash(demo: _Demo, w: dramatiq.Worker, actor: dramatiq.Actor[Any, Any]) -> ScenarioLine:
    key = demo.key("crash")
    payload = {"args": ["o-5"], "kwargs": {}}
    # a worker claimed the scope, then died without a trace
    operation = OPERATIONS["crash"]
    simulate_crash(demo.handler, operation=operation, tenant=TENANT, key=key, payload=payload)
    recovered = _wait_until(
        lambda: demo.handler.get_record(operation=operation, tenant=TENANT, key=key) is None,
        timeout=10,
    )
    actor.send_with_options(args=("o-5",), idempotency_key=key)
    demo.join(w)
    runs = demo.runs.get("crash", 0)
    fields = demo.record_fields(OPERATIONS["crash"], key)
    return ScenarioLine(
        INTEGRATION, "worker crash", 1, runs,
        "a dead worker's claim, freed by in-worker maintenance; then "
        "ran once",
        recovered and runs == 1 and fields == {"status": "SUCCESS", "retry_count": 1}, fields,
    )


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Wait for the maintenance thread's effect (bounded; it runs every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@contextlib.contextmanager
def _quiet_dramatiq_logs() -> Iterator[None]:
    """The demo prints its own report; Dramatiq's expected error logs would drown it."""
    logger = logging.getLogger("dramatiq")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)
