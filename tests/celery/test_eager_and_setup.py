"""Eager mode, setup options, configuration checks and in-worker maintenance (no broker)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from celery import Celery, signals

from idempotent_tasks import IdempotencyHandler, MemoryStore, Status, create_logger_adapter
from idempotent_tasks._core.records import Scope
from idempotent_tasks.celery import (
    CLEANUP_TASK,
    RECOVER_TASK,
    IdempotentTask,
    check_configuration,
    get_handler,
    idempotent_task,
    setup,
)
from tests._claims import claimed

from .conftest import Counter, key, wait_for


class FakeWorker:
    """What ``worker_ready`` / ``worker_shutdown`` senders look like: they carry ``.app``."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def eager_app(**setup_kwargs: Any) -> tuple[Celery, IdempotencyHandler, Counter]:
    app = Celery("eager", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    setup(app, handler, **setup_kwargs)
    return app, handler, Counter()


def test_eager_mode_reads_headers_and_replays() -> None:
    app, handler, runs = eager_app()

    @app.task(base=IdempotentTask, shared=False, bind=True, name="e.add")
    def add(self: IdempotentTask, x: int, y: int) -> int:
        runs.hit("add")
        assert self.request.idempotency.key == self.request.headers["idempotency_key"]
        return x + y

    k = key()
    assert add.apply_async((1, 2), idempotency_key=k, tenant="t").get() == 3
    assert add.apply((1, 2), idempotency_key=k, tenant="t").get() == 3
    assert runs["add"] == 1
    assert handler.get_record(operation="e.add", tenant="t", key=k).status is Status.SUCCESS
    with pytest.raises(Exception) as info:
        add.apply_async((1, 2), idempotency_key=key()).get()
    assert info.value.code == "MISSING_TENANT"
    assert runs["add"] == 1


def test_eager_transient_failures_poison_after_max_retries() -> None:
    app, handler, runs = eager_app()

    @idempotent_task(name="e.flaky", max_retries=2, default_retry_delay=0)
    def flaky() -> None:
        runs.hit("flaky")
        raise ConnectionError("down")

    k = key()
    result = app.tasks["e.flaky"].apply_async(idempotency_key=k, tenant="t")
    with pytest.raises(ConnectionError):
        result.get()
    assert runs["flaky"] == 2
    record = handler.get_record(operation="e.flaky", tenant="t", key=k)
    assert record.status is Status.FAILED and record.retry_count == 2


def test_default_tenant_and_task_id_key() -> None:
    app, handler, runs = eager_app(default_tenant="solo")

    @app.task(base=IdempotentTask, shared=False, name="e.unkeyed", require_key=False)
    def unkeyed() -> str:
        runs.hit("unkeyed")
        return "done"

    assert unkeyed.apply_async(task_id="fixed-id").get() == "done"
    assert unkeyed.apply_async(task_id="fixed-id").get() == "done"  # same task id: a redelivery
    assert unkeyed.apply_async(task_id="other-id").get() == "done"
    assert runs["unkeyed"] == 2
    assert handler.get_record(operation="e.unkeyed", tenant="solo", key="fixed-id")


def test_decorator_options_become_the_operations_defaults() -> None:
    app, handler, _ = eager_app()

    @app.task(base=IdempotentTask, shared=False, name="e.opts", ttl=60, lease_timeout=7, max_retries=9,
              on_stuck="fail")
    def opts() -> None:
        return None

    assert opts.max_retries is None  # Celery's own limit never ends an idempotent task
    o = handler.options_for("e.opts")  # registered when the task was bound (app finalized)
    assert (o.ttl, o.lease_timeout, o.max_retries, o.on_stuck) == (60, 7, 9, "fail")
    assert opts.acks_late and opts.reject_on_worker_lost
    assert get_handler(app) is handler


def test_task_of_an_app_without_setup_fails_with_configuration_error() -> None:
    app = Celery("nosetup", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(base=IdempotentTask, shared=False, name="n.task")
    def task() -> None:
        return None

    with pytest.raises(Exception) as info:
        task.apply_async(idempotency_key="k", tenant="t").get()
    assert info.value.code == "CONFIGURATION_ERROR"


def test_check_configuration_names_the_risks() -> None:
    events: list[tuple[str, str, Mapping[str, Any]]] = []
    handler = IdempotencyHandler(
        MemoryStore(), metrics=None, lease_timeout=4000,
        logger=create_logger_adapter(lambda lvl, msg, f: events.append((lvl, msg, f))),
    )
    app = Celery("risky", broker="amqp://guest@127.0.0.1//", set_as_current=False)
    app.conf.broker_heartbeat = 0

    @app.task(base=IdempotentTask, shared=False, name="r.early", acks_late=False)
    def early() -> None:
        return None

    setup(app, handler)
    app.finalize()  # what a worker does before it runs anything (tasks are lazy until then)
    risks = check_configuration(app)
    assert set(risks) == {
        "lease_may_expire_while_running", "broker_heartbeat_disabled",
        "lease_exceeds_consumer_timeout", "acks_early_loses_crashed_tasks",
    }
    warned = {f["risk"] for lvl, msg, f in events if msg == "celery_config_risk"}
    assert warned >= set(risks)

    safe = IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=60, heartbeat_interval=5)
    ok_app = Celery("safe", broker="amqp://guest@127.0.0.1//", set_as_current=False)
    setup(ok_app, safe)
    assert check_configuration(ok_app) == []
    safe.close()


def test_worker_maintenance_runs_recovery_under_a_store_lease() -> None:
    app = Celery("maint", broker="memory://", set_as_current=False)
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    state = setup(app, handler, maintenance="worker", recover_every=0.05, cleanup_every=60)
    assert RECOVER_TASK not in (app.conf.beat_schedule or {})
    assert RECOVER_TASK in app.tasks and CLEANUP_TASK in app.tasks
    call = handler._engine.prepare("m.op", "t", key(), {"x": 1}, True, {"lease_timeout": 0.01})
    assert call is not None
    claimed(handler, call)  # the claiming worker "died"
    worker = FakeWorker(app)
    signals.worker_ready.send(sender=worker)
    try:
        assert state.runner is not None
        wait_for(lambda: handler._engine.store.get(call.scope) is None, what="recovery by the runner")
        assert handler._engine.store.get_retry_count(call.scope) == 1
    finally:
        signals.worker_shutdown.send(sender=worker)
    assert state.runner._thread is not None and not state.runner._thread.is_alive()


def test_worker_maintenance_ignores_other_apps() -> None:
    app = Celery("maint2", broker="memory://", set_as_current=False)
    state = setup(app, IdempotencyHandler(MemoryStore(), metrics=None), maintenance="worker")
    signals.worker_ready.send(sender=FakeWorker(Celery("other", set_as_current=False)))
    assert state.runner is None
    assert isinstance(threading.active_count(), int)


def test_errors_keep_their_code_through_the_json_result_format() -> None:
    from celery.backends.base import Backend

    from idempotent_tasks._core.errors import ErrorCode, InvalidInputError

    backend = Backend(Celery("ser", set_as_current=False), serializer="json")
    err = InvalidInputError("tenant is required", code=ErrorCode.MISSING_TENANT,
                            operation="op", key="k")
    back = backend.exception_to_python(backend.prepare_exception(err))
    assert isinstance(back, InvalidInputError)
    assert (back.code, back.operation, back.key) == ("MISSING_TENANT", "op", "k")
    assert Scope("t", "op", "k")  # scope type unchanged


def test_structlog_context_is_bound_per_task() -> None:
    import structlog

    app, _, _ = eager_app()
    seen: list[dict[str, Any]] = []

    @app.task(base=IdempotentTask, shared=False, bind=True, name="e.logctx")
    def logctx(self: IdempotentTask) -> None:
        seen.append({"vars": structlog.contextvars.get_contextvars(), "id": self.request.id})

    logctx.apply_async(idempotency_key=key(), tenant="t").get()
    (one,) = seen
    assert one["vars"]["task_id"] == one["id"] and one["vars"]["task"] == "e.logctx"
    assert "task_id" not in structlog.contextvars.get_contextvars()  # unbound afterwards
