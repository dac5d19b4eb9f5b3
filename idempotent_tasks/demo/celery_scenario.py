"""The Celery part of ``idempotent-tasks demo``: real deliveries through a real Celery worker.

Everything runs in this process — Celery's in-memory transport (``memory://``), an in-memory
result backend and a real worker (``celery.contrib.testing.worker.start_worker``, threads
pool) with :mod:`idempotent_tasks.celery` — against the given store (the demo passes an SQLite
file), so no server is needed.  Each scenario reports how many messages were delivered, how
many times the body really ran, and whether that is what docs/guarantees.md promises.  Races are
forced with events (a body blocks until the duplicates were seen waiting); the only wait is
for a 0.5 s lease to run out, which is the thing being shown.  Keys are unique per run, so the
demo can be re-run on the same store.
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
from typing import Any, Literal

from celery import Celery, signals
from celery.contrib.testing.worker import start_worker

from .._core.handler import IdempotencyHandler
from .._core.metrics import Metrics
from .._core.records import Status
from ..celery import RECOVER_TASK, IdempotentTask, setup
from ..stores.urls import store_from_url
from ..testing import simulate_crash
from ._report import ScenarioLine

INTEGRATION = "celery"
TENANT = "demo"
_WAIT = 10.0  # upper bound of every wait: a hung scenario fails, never hangs
_FAST: dict[str, Any] = {"default_retry_delay": 0.05, "wait_backoff": (0.05, 0.2), "shared": False}


class _Rejected(Exception):
    """The demo's permanent business error."""


@dataclass
class _Demo:
    app: Celery
    handler: IdempotencyHandler
    run_id: str
    runs: dict[str, int] = field(default_factory=dict)
    in_progress: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    release: threading.Event = field(default_factory=threading.Event)
    tasks: dict[str, Any] = field(default_factory=dict)

    def key(self, name: str) -> str:
        return f"{name}-{self.run_id}"

    def ran(self, name: str) -> None:
        with self.cond:
            self.runs[name] = self.runs.get(name, 0) + 1

    def send(self, name: str, args: tuple[Any, ...], key: str, **options: Any) -> Any:
        return self.tasks[name].apply_async(args, idempotency_key=key, tenant=TENANT, **options)

    def record_fields(self, name: str, key: str) -> dict[str, object]:
        record = self.handler.get_record(operation=self.tasks[name].name, tenant=TENANT, key=key)
        if record is None:
            return {"status": None}
        return {"status": record.status.value, "retry_count": record.retry_count}

    def on_retry(self, sender: Any = None, reason: Any = None, **_: Any) -> None:
        if getattr(getattr(reason, "exc", None), "code", None) == "REQUEST_IN_PROGRESS":
            with self.cond:
                self.in_progress += 1
                self.cond.notify_all()

    def wait_in_progress(self, count: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.in_progress >= count, _WAIT)


def run_scenario(
    store_url: str, workdir: Path, *, metrics: Metrics | Literal["auto"] | None = "auto",
    prefix: str | None = None,
) -> list[ScenarioLine]:
    """Run the five Celery scenarios on ``store_url``; one :class:`ScenarioLine` each.

    ``metrics``: where the handler records (the handler's default when omitted);
    ``prefix``: the store's table / key prefix."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = store_from_url(store_url, prefix=prefix)
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=metrics)
    app = _app()
    setup(app, handler)
    demo = _Demo(app, handler, uuid.uuid4().hex[:8])
    _declare(demo)
    signals.task_retry.connect(demo.on_retry, weak=False)
    try:
        with _quiet_celery_logs(), start_worker(
            app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="CRITICAL",
            shutdown_timeout=_WAIT,
        ):
            return [scenario(demo) for scenario in SCENARIOS]
    finally:
        demo.release.set()
        signals.task_retry.disconnect(demo.on_retry)
        handler.close()
        store.close()


def _app() -> Celery:
    app = Celery(f"idempotency_demo_{uuid.uuid4().hex[:6]}", broker="memory://",
                 backend="cache+memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=f"idempotency_demo_{uuid.uuid4().hex[:8]}",
        broker_transport_options={"polling_interval": 0.01},
        worker_hijack_root_logger=False,
        task_time_limit=60,  # below the handler's lease: a running body never loses it
    )
    return app


def _declare(demo: _Demo) -> None:
    """The demo's tasks: a charge, a slow one, a rejected one, a flaky one, a crashing one."""

    def charge(order_id: str, amount: int) -> dict[str, object]:
        demo.ran("charge")
        return {"order": order_id, "charged": amount}

    def slow(order_id: str) -> str:
        demo.ran("slow")
        demo.release.wait(_WAIT)
        return order_id

    def reject(order_id: str) -> None:
        demo.ran("reject")
        raise _Rejected(f"order {order_id} is invalid")

    def flaky(order_id: str) -> None:
        demo.ran("flaky")
        raise ConnectionError("the payment gateway timed out")

    def crash(order_id: str) -> str:
        demo.ran("crash")
        return order_id

    task = demo.app.task
    demo.tasks.update(
        charge=task(base=IdempotentTask, name="demo.celery.charge", **_FAST)(charge),
        slow=task(base=IdempotentTask, name="demo.celery.slow", **_FAST)(slow),
        reject=task(
            base=IdempotentTask, name="demo.celery.reject", permanent=(_Rejected,), **_FAST
        )(reject),
        flaky=task(base=IdempotentTask, name="demo.celery.flaky", max_retries=3, **_FAST)(flaky),
        crash=task(base=IdempotentTask, name="demo.celery.crash", lease_timeout=0.5, **_FAST)(
            crash
        ),
    )


def _get(result: Any) -> tuple[bool, Any]:
    """(succeeded, value or error) of a task result."""
    try:
        return True, result.get(timeout=_WAIT, interval=0.01, propagate=True)
    except Exception as exc:
        return False, exc


def _duplicates(demo: _Demo) -> ScenarioLine:
    key = demo.key("dup")
    first = demo.send("charge", ("o-1", 100), key)
    _get(first)
    again = [demo.send("charge", ("o-1", 100), key, task_id=first.id)]  # a broker redelivery
    again += [demo.send("charge", ("o-1", 100), key) for _ in range(2)]  # producer retries
    same = all(_get(r) == (True, {"order": "o-1", "charged": 100}) for r in again)
    runs = demo.runs.get("charge", 0)
    fields = demo.record_fields("charge", key)
    return ScenarioLine(
        INTEGRATION, "duplicate deliveries", 4, runs, "ran once, replayed 3 times",
        same and runs == 1 and fields["status"] == Status.SUCCESS.value, fields,
    )


def _concurrent(demo: _Demo) -> ScenarioLine:
    key = demo.key("concurrent")
    results = [demo.send("slow", ("o-2",), key) for _ in range(3)]
    forced = demo.wait_in_progress(2)  # both duplicates saw PROCESSING and were retried
    demo.release.set()
    values = [_get(r) for r in results]
    runs = demo.runs.get("slow", 0)
    fields = {**demo.record_fields("slow", key), "in_progress_retries": demo.in_progress}
    return ScenarioLine(
        INTEGRATION, "concurrent duplicates", 3, runs,
        "ran once; duplicates retried while it ran, then replayed",
        forced and runs == 1 and values == [(True, "o-2")] * 3
        and fields["status"] == Status.SUCCESS.value, fields,
    )


def _permanent(demo: _Demo) -> ScenarioLine:
    key = demo.key("permanent")
    ok1, err1 = _get(demo.send("reject", ("o-3",), key))
    ok2, err2 = _get(demo.send("reject", ("o-3",), key))  # redelivered: refused, never re-run
    runs = demo.runs.get("reject", 0)
    fields = {**demo.record_fields("reject", key), "second": str(getattr(err2, "code", err2))}
    return ScenarioLine(
        INTEGRATION, "permanent failure", 2, runs, "poisoned at once; the retry is refused",
        not ok1 and isinstance(err1, _Rejected) and not ok2 and fields["second"] == "REQUEST_FAILED"
        and runs == 1 and fields["status"] == Status.FAILED.value, fields,
    )


def _flaky(demo: _Demo) -> ScenarioLine:
    key = demo.key("flaky")
    ok, err = _get(demo.send("flaky", ("o-4",), key))
    runs = demo.runs.get("flaky", 0)
    fields = demo.record_fields("flaky", key)
    return ScenarioLine(
        INTEGRATION, "flaky task", 1, runs,
        "ran 3x for 1 message: Celery retried each transient error until the store had "
        "counted 3 (max_retries=3); poisoned",
        not ok and isinstance(err, ConnectionError) and runs == 3
        and fields == {"status": Status.FAILED.value, "retry_count": 3}, fields,
    )


def _crash(demo: _Demo) -> ScenarioLine:
    key = demo.key("crash")
    h = demo.handler
    simulate_crash(  # a worker claimed the scope, then died without a trace
        h, operation="demo.celery.crash", tenant=TENANT, key=key,
        payload={"args": ["o-5"], "kwargs": {}},
    )
    record = h.get_record(operation="demo.celery.crash", tenant=TENANT, key=key)
    lease_end = record.lease_expires_at if record and record.lease_expires_at else 0.0
    _wait_until(lambda: h.clock() > lease_end)
    _, handled = _get(demo.app.send_task(RECOVER_TASK))  # what beat runs every 5 minutes
    ok, value = _get(demo.send("crash", ("o-5",), key))
    runs = demo.runs.get("crash", 0)
    fields = {**demo.record_fields("crash", key), "recovered": handled}
    return ScenarioLine(
        INTEGRATION, "worker crash", 1, runs,
        "a dead worker's claim, freed by the beat maintenance task; "
        "then ran once",
        ok and value == "o-5" and handled == 1 and runs == 1
        and fields["status"] == Status.SUCCESS.value and fields["retry_count"] == 1, fields,
    )


SCENARIOS: tuple[Callable[[_Demo], ScenarioLine], ...] = (
    _duplicates, _concurrent, _permanent, _flaky, _crash,
)


def _wait_until(predicate: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + _WAIT
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@contextlib.contextmanager
def _quiet_celery_logs() -> Iterator[None]:
    """The demo prints its own report; Celery's expected error logs would drown it."""
    loggers = [logging.getLogger(name) for name in ("celery", "kombu")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


__all__ = ["run_scenario"]
