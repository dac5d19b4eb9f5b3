"""The per-operation policies as taskiq options, with taskiq's own receiver in the test
process on a real Redis stream: the middleware's apply to every idempotent task, a task's
own ``@idempotent(...)`` value wins over them, and ``on_success="reject"`` makes a duplicate
of a success the refusal ``DUPLICATE_REJECTED`` (the task's result, acked); a task's
``reconcile=`` answers a delivery after a crashed attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    IdempotencyHandler,
    MemoryStore,
    Reconciled,
    RedisStore,
)
from idempotent_tasks.taskiq import (
    OUTCOME_LABEL,
    IdempotencyMiddleware,
    idempotency_labels,
    idempotent,
)
from idempotent_tasks.testing import FakeClock, simulate_crash

from .._services import REDIS_URL
from .test_in_process import _broker, _with_receiver, prefix  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)


def test_the_middlewares_policy_and_a_tasks_own(prefix: str) -> None:  # noqa: F811
    store = RedisStore(REDIS_URL, prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None)
    broker = _broker(prefix).with_middlewares(
        IdempotencyMiddleware(handler, default_tenant="acme", on_success="reject"))
    calls: list[str] = []

    @idempotent(broker, task_name="it.strict")
    async def strict(n: int) -> int:
        calls.append("strict")
        return n

    @idempotent(broker, task_name="it.lenient", on_success="replay")
    async def lenient(n: int) -> int:
        calls.append("lenient")
        return n

    async def twice(task: Any, key: str) -> tuple[Any, Any]:
        labels = idempotency_labels(key)
        first = await (await task.kicker().with_labels(**labels).kiq(5)).wait_result(timeout=30)
        again = await (await task.kicker().with_labels(**labels).kiq(5)).wait_result(timeout=30)
        return first, again

    async def scenario() -> tuple[Any, Any]:
        return await twice(strict, "k-strict"), await twice(lenient, "k-lenient")

    (first, refused), (_, replayed) = asyncio.run(_with_receiver(broker, scenario()))
    assert (first.return_value, first.labels[OUTCOME_LABEL]) == (5, "executed")
    assert refused.is_err and refused.labels[OUTCOME_LABEL] == "rejected"
    assert getattr(refused.error, "code", None) == "DUPLICATE_REJECTED"
    assert (replayed.return_value, replayed.labels[OUTCOME_LABEL]) == (5, "replayed")
    assert calls == ["strict", "lenient"]
    store.close()


def test_a_bad_policy_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="on_failure"):
        IdempotencyMiddleware(IdempotencyHandler(MemoryStore(), metrics=None),
                              on_failure="sometimes")


def test_reconcile_after_a_crash_answers_done_and_refuses_unknown(
    prefix: str,  # noqa: F811
) -> None:
    """A crashed attempt (``simulate_crash``) whose lease expired: the middleware's
    ``reconcile`` (the task sets ``on_stuck="reconcile"``) answers before its body runs again — ``done`` is the task's (replayed) result,
    ``unknown`` its error ``OUTCOME_UNCERTAIN`` (acked: a final outcome).  The body never
    runs."""
    clock = FakeClock()
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=30)
    answers = {"k-done": Reconciled.done(7), "k-unknown": Reconciled.unknown("no answer")}
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(
        handler, default_tenant="acme", reconcile=lambda ctx: answers[ctx.key]))
    calls: list[int] = []

    @idempotent(broker, task_name="it.charge", on_stuck="reconcile",
                payload=lambda n: {"n": n})
    async def charge(n: int) -> int:
        calls.append(n)
        return -1

    for k in answers:
        assert isinstance(simulate_crash(handler, operation="it.charge", tenant="acme", key=k,
                                         payload={"n": 1}), int)
    clock.advance(31)

    async def scenario() -> list[Any]:
        return [await (await charge.kicker().with_labels(**idempotency_labels(k)).kiq(1))
                .wait_result(timeout=30) for k in answers]

    done, refused = asyncio.run(_with_receiver(broker, scenario()))
    assert (done.return_value, done.labels[OUTCOME_LABEL]) == (7, "replayed")
    assert refused.is_err and refused.labels[OUTCOME_LABEL] == "rejected"
    assert getattr(refused.error, "code", None) == "OUTCOME_UNCERTAIN"
    assert calls == []
