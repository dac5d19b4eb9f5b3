"""``reconcile=`` as a Celery task option: ``@idempotent_task(...)`` keyword and
``IdempotentTask`` class attribute, registered as the operation's default and passed on every
delivery.  A crashed attempt (``simulate_crash``: the record a SIGKILLed worker leaves) whose
lease expired is reconciled before the body runs again: ``done`` is the task's replayed result,
``unknown`` fails the task with ``OUTCOME_UNCERTAIN`` (a final outcome: no requeue) and the
record is UNCERTAIN.  The real-worker versions are in test_effects_worker.py."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from idempotent_tasks import IdempotencyContext, IdempotencyHandler, MemoryStore, Reconciled, Status
from idempotent_tasks.celery import IdempotentTask, idempotent_task, setup
from idempotent_tasks.testing import FakeClock, simulate_crash

from .conftest import Counter, key

LEASE = 30.0


def eager_app(clock: FakeClock) -> tuple[Celery, IdempotencyHandler]:
    app = Celery("reconcile", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    app.conf.task_always_eager = True
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=LEASE)
    setup(app, handler)
    return app, handler


def crashed(handler: IdempotencyHandler, clock: FakeClock, operation: str, k: str) -> None:
    """A worker died inside the body of ``(acme, operation, k)`` and its lease expired."""
    assert isinstance(simulate_crash(handler, operation=operation, tenant="acme", key=k,
                                     payload={"n": 1}), int)
    clock.advance(LEASE + 1)


def test_reconcile_done_is_the_replayed_result_and_unknown_fails_the_task() -> None:
    clock = FakeClock()
    app, handler = eager_app(clock)
    runs, asked = Counter(), []
    answers = {"k-done": Reconciled.done({"charged": True}),
               "k-unknown": Reconciled.unknown("the processor does not answer")}

    def reconcile(ctx: IdempotencyContext) -> Reconciled:
        asked.append(ctx.derived_key("charge"))
        return answers[ctx.key.split(":")[0]]

    @idempotent_task(name="r.charge", on_stuck="reconcile", reconcile=reconcile,
                     payload=lambda n: {"n": n})
    def charge(n: int) -> dict[str, Any]:
        runs.hit("charge")
        return {"charged": "again"}

    task = app.tasks["r.charge"]
    assert handler.options_for("r.charge").reconcile is reconcile
    done_key, unknown_key = f"k-done:{key()}", f"k-unknown:{key()}"
    crashed(handler, clock, "r.charge", done_key)
    assert task.apply_async((1,), idempotency_key=done_key, tenant="acme").get() == {
        "charged": True}
    crashed(handler, clock, "r.charge", unknown_key)
    with pytest.raises(Exception) as info:
        task.apply_async((1,), idempotency_key=unknown_key, tenant="acme").get()
    assert info.value.code == "OUTCOME_UNCERTAIN"
    assert "the processor does not answer" in str(info.value)
    record = handler.get_record(operation="r.charge", tenant="acme", key=unknown_key)
    assert record is not None and record.status is Status.UNCERTAIN
    assert runs.counts == {} and len(asked) == 2  # the body never ran again


def test_reconcile_as_a_class_attribute_stays_a_plain_function() -> None:
    clock = FakeClock()
    app, handler = eager_app(clock)

    def look_up(ctx: IdempotencyContext) -> Reconciled:
        return Reconciled.done("found downstream")

    class Declared(IdempotentTask):
        on_stuck = "reconcile"
        reconcile = look_up  # a plain function, not bound to the task

    @app.task(base=Declared, shared=False, name="r.declared", payload=lambda n: {"n": n})
    def declared(n: int) -> str:
        return "ran"

    app.finalize()
    assert handler.options_for("r.declared").reconcile is look_up
    k = key()
    crashed(handler, clock, "r.declared", k)
    assert declared.apply_async((1,), idempotency_key=k, tenant="acme").get() == (
        "found downstream")
