"""The one outcome table (docs/design.md, "One outcome, one table"), row by row, for every
integration: each kind is produced by a real ``handler.run`` and handed to the integration's
own mapping, and the framework action must be the table's.  (HTTP: tests/http.)  End to end,
through real workers and brokers, the same rows are exercised by each integration's tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore, Outcome
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

KINDS = ["executed", "replayed", "in_progress", "failed", "poisoned", "rejected",
         "store_unavailable", "superseded"]


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


def produce(kind: str, operation: str = "table.op") -> tuple[Outcome, Any]:
    """A real outcome of ``kind`` from ``handler.run``, and what the body would return."""
    store = FaultyStore(MemoryStore())
    clock = FakeClock()
    handler = IdempotencyHandler(store, metrics=None, clock=clock,  # type: ignore[arg-type]
                                 lease_timeout=10)
    key = uuid.uuid4().hex
    body: Callable[[], Any] = lambda: {"n": 1}  # noqa: E731
    tenant: str | None = "acme"
    if kind == "replayed":
        handler.run(body, operation=operation, tenant=tenant, key=key)
    elif kind == "in_progress":
        simulate_crash(handler, operation=operation, tenant="acme", key=key)
    elif kind == "failed":
        body = _raise(Transient("flaky"))
    elif kind == "poisoned":
        body = _raise(Permanent("declined"))
    elif kind == "rejected":
        tenant = None
    elif kind == "store_unavailable":
        store.fail("create")
    elif kind == "superseded":
        body = _paused_past_the_lease(handler, clock, operation, key)
    outcome = handler.run(body, operation=operation, tenant=tenant, key=key,
                          permanent=(Permanent,))
    assert outcome.kind == kind, outcome
    return outcome, handler


def _paused_past_the_lease(handler: IdempotencyHandler, clock: FakeClock, operation: str,
                           key: str) -> Callable[[], Any]:
    """A body frozen past its lease while another attempt takes the scope over: its own
    completion is then fenced off (the forced lease loss)."""
    def body() -> Any:
        clock.advance(11)
        simulate_crash(handler, operation=operation, tenant="acme", key=key)
        return {"n": 1}

    return body


def _raise(exc: Exception) -> Callable[[], Any]:
    def body() -> Any:
        raise exc

    return body


# -- the loops: commit / ack, dead-letter, or come back later -------------------------------
LOOP_ROWS = {  # kind: (settled, dead_letter, retry)
    "executed": (True, False, False),
    "replayed": (True, False, False),
    "in_progress": (False, False, True),
    "failed": (False, False, True),
    "poisoned": (True, True, False),
    "rejected": (True, True, False),
    "store_unavailable": (False, False, True),
    "superseded": (False, False, True),
}


@pytest.mark.parametrize("kind", KINDS)
def test_consumer_loops_row(kind: str) -> None:
    outcome, _ = produce(kind)
    assert (outcome.settled, outcome.dead_letter, outcome.retry) == LOOP_ROWS[kind]


# -- Celery ------------------------------------------------------------------------------
celery = pytest.importorskip("celery")


@pytest.mark.parametrize("kind", KINDS)
def test_celery_row(kind: str) -> None:
    from celery import Celery
    from celery.exceptions import Retry

    from idempotent_tasks.celery import IdempotentTask, setup
    from idempotent_tasks.celery._delivery import Delivery
    from idempotent_tasks.celery._outcomes import apply

    outcome, handler = produce(kind)
    app = Celery("table", broker="memory://", set_as_current=False)
    setup(app, handler, beat=False, default_tenant="acme")

    @app.task(base=IdempotentTask, name="table.op", shared=False, wait_backoff=(1.0, 2.0),
              permanent=(Permanent,))
    def task() -> None: ...

    task.push_request(id=uuid.uuid4().hex, retries=0, is_eager=False, called_directly=False,
                      delivery_info={"routing_key": "celery"})
    delivery = Delivery(task, (), {}, handler, outcome.tenant, outcome.key, None,
                        task.request)
    try:
        if kind in ("executed", "replayed"):
            assert apply(delivery, outcome) == {"n": 1}
        elif kind in ("in_progress", "failed", "store_unavailable", "superseded"):
            with pytest.raises(Retry):  # retried with backoff (counted only when "failed")
                apply(delivery, outcome)
        else:
            with pytest.raises(BaseException) as raised:  # fails, no requeue
                apply(delivery, outcome)
            assert not isinstance(raised.value, Retry)
            assert not getattr(raised.value, "requeue", False)
        assert task.request.idempotency.outcome == kind
    finally:
        task.pop_request()


def test_celery_stale_owner_comes_back_instead_of_acking() -> None:
    """A stale owner (its SUCCESS refused: another attempt took the scope over) must not
    ack: on the Redis broker the ack would delete the new owner's unacked entry."""
    from celery import Celery
    from celery.exceptions import Retry

    from idempotent_tasks.celery import IdempotentTask, setup
    from idempotent_tasks.celery._delivery import Delivery
    from idempotent_tasks.celery._outcomes import apply

    clock = FakeClock()
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=10)
    key = uuid.uuid4().hex

    def paused() -> str:  # frozen past its lease; meanwhile another attempt takes over
        clock.advance(11)
        simulate_crash(handler, operation="table.stale", tenant="acme", key=key)
        return "mine"

    outcome = handler.run(paused, operation="table.stale", tenant="acme", key=key)
    assert (outcome.kind, outcome.lease_lost, outcome.result) == ("superseded", True, "mine")
    assert not outcome.settled and outcome.retry and outcome.unwrap() == "mine"
    app = Celery("stale", broker="memory://", set_as_current=False)
    setup(app, handler, beat=False, default_tenant="acme")

    @app.task(base=IdempotentTask, name="table.stale", shared=False, wait_backoff=(1.0, 2.0))
    def task() -> None: ...

    task.push_request(id=uuid.uuid4().hex, retries=0, is_eager=False, called_directly=False,
                      delivery_info={"routing_key": "celery"})
    try:
        with pytest.raises(Retry):
            apply(Delivery(task, (), {}, handler, "acme", key, None, task.request), outcome)
    finally:
        task.pop_request()


# -- Dramatiq ----------------------------------------------------------------------------
dramatiq = pytest.importorskip("dramatiq")


@pytest.mark.parametrize("kind", KINDS)
def test_dramatiq_row(kind: str) -> None:
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import SkipMessage

    from idempotent_tasks.dramatiq import IdempotencyRetry, _state
    from idempotent_tasks.dramatiq._runner import ACTIONS, MessageRun
    from idempotent_tasks.dramatiq._spec import ActorSpec

    outcome, handler = produce(kind)
    message = dramatiq.Message(queue_name="q", actor_name="table.op", args=(), kwargs={},
                               options={}, message_id=uuid.uuid4().hex, message_timestamp=0)
    run = MessageRun(handler, ActorSpec("table.op", permanent=(Permanent,)), StubBroker(),
                     message, "acme")
    decision: Any = None
    try:
        result = ACTIONS[kind](run, outcome)
    except SkipMessage:
        result = "skipped"
    except BaseException as exc:
        decision = _state.decision_for(exc)
        result = exc
    if kind == "executed":
        assert result == {"n": 1}
    elif kind == "replayed":
        assert result == "skipped"
    elif kind in ("in_progress", "store_unavailable", "superseded"):
        assert isinstance(result, IdempotencyRetry) and decision is _state.Decision.RETRY
    elif kind == "failed":
        assert isinstance(result, Transient) and decision is _state.Decision.RETRY
    else:
        assert decision is _state.Decision.DEAD_LETTER


# -- taskiq and FastStream ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_taskiq_row(kind: str) -> None:
    """taskiq: a settled kind is the task's result or its error; the others raise the retry
    signal its middleware turns into "sent again" (the superseded one included)."""
    pytest.importorskip("taskiq")
    from idempotent_tasks.taskiq._delivery import IdempotencyRetry, _raise

    outcome, _ = produce(kind)
    if kind in ("executed", "replayed"):
        return  # the task's result; nothing is raised
    with pytest.raises(BaseException) as raised:
        _raise(outcome)
    retried = isinstance(raised.value, IdempotencyRetry)
    assert retried is (kind in ("in_progress", "store_unavailable", "superseded")) or (
        kind == "failed" and isinstance(raised.value, Transient) and outcome.retry
    )
