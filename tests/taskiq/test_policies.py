"""The per-operation policies as taskiq options, with taskiq's own receiver in the test
process on a real Redis stream: the middleware's apply to every idempotent task, a task's
own ``@idempotent(...)`` value wins over them, and ``on_success="reject"`` makes a duplicate
of a success the refusal ``DUPLICATE_REJECTED`` (the task's result, acked)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, IdempotencyHandler, MemoryStore, RedisStore
from idempotent_tasks.taskiq import (
    OUTCOME_LABEL,
    IdempotencyMiddleware,
    idempotency_labels,
    idempotent,
)

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
