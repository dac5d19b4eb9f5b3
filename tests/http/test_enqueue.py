"""Key propagation: a retried HTTP request leads to exactly one task execution.

Dramatiq (StubBroker + an in-process Worker with the Dramatiq integration) behind FastAPI,
and Celery (eager mode with the Celery integration) behind Flask.  The endpoint enqueues its
task and then fails transiently the first time, so the client's retry runs the endpoint — and
enqueues — again; the derived key makes the second message a duplicate of the first.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import dramatiq
import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker

from idempotent_tasks import ConfigurationError, IdempotencyHandler, MemoryStore
from idempotent_tasks.http import derive_task_key, enqueue_once

from ._apps import ASGIDriver, Script, WSGIDriver, fastapi_app, flask_app


def test_retried_request_runs_its_dramatiq_task_once(handler: IdempotencyHandler) -> None:
    from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor

    broker = StubBroker()
    broker.add_middleware(IdempotencyMiddleware(handler))
    executions: list[str] = []

    @idempotent_actor(broker=broker, actor_name=f"send_receipt_{uuid.uuid4().hex[:8]}")
    def send_receipt(order_id: str) -> dict[str, str]:
        executions.append(order_id)
        return {"sent": order_id}

    messages: list[Any] = []
    script = Script(statuses=[503])  # enqueue, then fail transiently
    script.on_run = lambda item: messages.append(enqueue_once(send_receipt, item))
    driver = ASGIDriver(fastapi_app(handler, script))
    key = str(uuid.uuid4())
    statuses = [driver.request("POST", "/payments/7", key=key, json={"amount": 1}).status
                for _ in range(3)]
    assert statuses == [503, 201, 201]  # the third is a replay: the endpoint did not run
    assert script.runs == 2 and len(messages) == 2
    keys = {m.options["idempotency_key"] for m in messages}
    assert len(keys) == 1 and {m.options["tenant"] for m in messages} == {"acme"}

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        broker.join(send_receipt.queue_name, fail_fast=False, timeout=20_000)
        worker.join()
    finally:
        worker.stop()
    assert executions == ["7"]
    record = handler.get_record(operation=send_receipt.actor_name, tenant="acme", key=keys.pop())
    assert record is not None and record.response == {"sent": "7"}


def test_retried_request_runs_its_celery_task_once(handler: IdempotencyHandler) -> None:
    from idempotent_tasks.celery import IdempotentTask, setup

    app = Celery("http_enqueue", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True)
    setup(app, handler, beat=False)
    executions: list[str] = []

    @app.task(base=IdempotentTask, name=f"receipts.send_{uuid.uuid4().hex[:8]}")  # type: ignore[untyped-decorator]
    def send_receipt(order_id: str) -> dict[str, str]:
        executions.append(order_id)
        return {"sent": order_id}

    results: list[Any] = []
    script = Script(statuses=[500])
    script.on_run = lambda item: results.append(enqueue_once(send_receipt, item).get())
    driver = WSGIDriver(flask_app(handler, script))
    key = str(uuid.uuid4())
    statuses = [driver.request("POST", "/payments/9", key=key, json={"amount": 1}).status
                for _ in range(3)]
    assert statuses == [500, 201, 201]
    assert executions == ["9"]  # ran on the first request only; the retry's enqueue replayed
    assert results == [{"sent": "9"}, {"sent": "9"}]


class RecordingTask:
    """A stand-in with Celery's ``apply_async`` shape, to look at what is sent."""

    name = "reports.build"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_async(self, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any) -> str:
        self.calls.append({"args": args, "kwargs": kwargs, **options})
        return "sent"


def _run_body(handler: IdempotencyHandler, task: RecordingTask, key: str, fail: bool) -> None:
    def body() -> str:
        enqueue_once(task, 1)
        enqueue_once(task, 2)  # second call for the same task: the next position
        enqueue_once(task, 3, key_suffix="audit")
        if fail:
            raise RuntimeError("transient")
        return "ok"

    with contextlib.suppress(RuntimeError):
        handler.execute(body, operation="POST /reports", tenant="acme", key=key)


def test_keys_are_deterministic_per_scope_task_suffix_and_position() -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    task = RecordingTask()
    _run_body(handler, task, "k1", fail=True)
    _run_body(handler, task, "k1", fail=False)  # the retry of the same request
    _run_body(handler, task, "k2", fail=False)  # another request
    keys = [c["headers"]["idempotency_key"] for c in task.calls]
    assert keys[:3] == keys[3:6]  # the retry derives exactly the same keys, in order
    assert len(set(keys[:3])) == 3  # position and suffix give distinct keys in one body
    assert not set(keys[:3]) & set(keys[6:])  # another request key → other task keys
    assert {c["headers"]["idempotency_tenant"] for c in task.calls} == {"acme"}
    assert [c["args"] for c in task.calls[:3]] == [(1,), (2,), (3,)]
    assert all(len(k) == 64 for k in keys)


def test_derived_keys_do_not_collide_across_part_boundaries() -> None:
    from idempotent_tasks import IdempotencyContext

    a = IdempotencyContext(tenant="a:b", operation="c", key="k", request_hash=None, outcome="x")
    b = IdempotencyContext(tenant="a", operation="b:c", key="k", request_hash=None, outcome="x")
    assert derive_task_key(a, "t") != derive_task_key(b, "t")
    assert derive_task_key(a, "t", "s") != derive_task_key(a, "t", "", 1)


def test_enqueue_once_outside_a_protected_body_refuses() -> None:
    with pytest.raises(ConfigurationError):
        enqueue_once(RecordingTask(), 1)


def test_enqueue_once_refuses_what_is_not_a_task() -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None)

    class Named:
        name = "x"

    with pytest.raises(ConfigurationError):
        handler.execute(lambda: enqueue_once(Named()), operation="op", tenant="t", key="k")


def test_enqueue_is_its_own_module_and_serves_any_protected_body() -> None:
    """``idempotent_tasks.enqueue`` is the home; ``idempotent_tasks.http`` re-exports it, and a
    body run by the handler directly (a task, a consumer) derives the same keys."""
    import idempotent_tasks.enqueue as enqueue
    import idempotent_tasks.http as http

    assert http.enqueue_once is enqueue.enqueue_once
    assert http.derive_task_key is enqueue.derive_task_key
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    task = RecordingTask()
    handler.execute(lambda: (enqueue.enqueue_once(task, 1), enqueue.enqueue_once(task, 2)),
                    operation="op", tenant="t", key="k")
    keys = [c["headers"]["idempotency_key"] for c in task.calls]
    assert len(set(keys)) == 2 and {c["headers"]["idempotency_tenant"] for c in task.calls} == {"t"}
