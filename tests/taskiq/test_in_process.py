"""The taskiq rows that need control over the store (a store that goes down) and the setup
checks, with taskiq's own receiver running in the test process on a real Redis stream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from idempotent_tasks import ConfigurationError, IdempotencyHandler, Outcome, RedisStore
from idempotent_tasks.taskiq import (
    OUTCOME_LABEL,
    IdempotencyMiddleware,
    idempotency_labels,
    idempotent,
)
from idempotent_tasks.testing import FaultyStore

from .._services import REDIS_URL, require
from .conftest import _cleanup_redis

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def prefix() -> Iterator[str]:
    require("redis")
    name = f"it_tqp_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        _cleanup_redis(name)


def _broker(prefix: str) -> Any:
    return RedisStreamBroker(
        REDIS_URL, queue_name=f"{prefix}:stream", consumer_group_name=f"{prefix}:group",
        consumer_id="0", xread_block=100,
    ).with_result_backend(RedisAsyncResultBackend(REDIS_URL, prefix_str=f"{prefix}:results"))


async def _with_receiver(broker: Any, scenario: Any) -> Any:
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(run_receiver_task(broker, max_async_tasks=10))
    try:
        return await scenario
    finally:
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await broker.shutdown()


def test_store_down_never_runs_the_body_and_the_task_comes_back(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix)
    faulty = FaultyStore(store)
    handler = IdempotencyHandler(faulty, metrics=None)  # type: ignore[arg-type]
    kinds: list[str] = []
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(
        handler, default_tenant="acme", retry_backoff=(0.05, 0.1),
        on_outcome=lambda m, o: kinds.append(o.kind)))
    calls: list[int] = []

    @idempotent(broker, task_name="it.store_down")
    async def charge(n: int) -> int:
        calls.append(n)
        return n * 2

    async def scenario() -> Any:
        faulty.fail("*")
        task = await charge.kicker().with_labels(**idempotency_labels("k-1")).kiq(21)
        while kinds.count("store_unavailable") < 2:
            await asyncio.sleep(0.01)  # polling what the middleware recorded
        assert calls == []
        faulty.heal()
        return await task.wait_result(timeout=30)

    result = asyncio.run(_with_receiver(broker, scenario()))
    assert result.return_value == 42 and result.labels[OUTCOME_LABEL] == "executed"
    assert calls == [21]
    assert set(kinds) == {"store_unavailable", "executed"}
    store.close()


def test_direct_calls_run_the_plain_body_and_a_worker_without_the_middleware_refuses(
    prefix: str,
) -> None:
    broker = _broker(prefix)
    seen: list[Outcome] = []

    @idempotent(broker, task_name="it.plain")
    async def double(n: int) -> int:
        return n * 2

    assert asyncio.run(double(4)) == 8  # a direct call is not a delivery
    broker.is_worker_process = True
    with pytest.raises(ConfigurationError, match="IdempotencyMiddleware"):
        asyncio.run(double(4))
    assert seen == []


def test_a_task_labelled_idempotent_but_not_declared_with_it_stops_the_worker(
    prefix: str,
) -> None:
    handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(handler))

    @broker.task(task_name="it.mislabelled", idempotent=True)
    async def mislabelled() -> None: ...

    with pytest.raises(ConfigurationError, match=r"it\.mislabelled"):
        asyncio.run(broker.startup())


def test_a_sync_body_runs_off_the_loop_and_replays(prefix: str) -> None:
    import threading

    handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(handler, default_tenant="a"))
    threads: list[str] = []

    @idempotent(broker, task_name="it.sync")
    def triple(n: int) -> int:
        threads.append(threading.current_thread().name)
        return n * 3

    async def scenario() -> tuple[Any, Any]:
        labels = idempotency_labels("k-sync")
        first = await (await triple.kicker().with_labels(**labels).kiq(2)).wait_result(timeout=30)
        again = await (await triple.kicker().with_labels(**labels).kiq(2)).wait_result(timeout=30)
        return first, again

    first, again = asyncio.run(_with_receiver(broker, scenario()))
    assert (first.return_value, first.labels[OUTCOME_LABEL]) == (6, "executed")
    assert (again.return_value, again.labels[OUTCOME_LABEL]) == (6, "replayed")
    assert len(threads) == 1 and threads[0] != "MainThread"


def test_no_thread_hop_with_an_async_store(prefix: str) -> None:
    """With an async store, the claim, the body and the outcome write of a message are all
    awaited on the worker's loop: ``asyncio.to_thread``, executors and new threads are
    forbidden while the receiver processes (and replays) it."""
    from idempotent_tasks import AsyncRedisStore

    from ..faststream._harness import no_thread_hop

    store = AsyncRedisStore(REDIS_URL, prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None)
    kinds: list[str] = []
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(
        handler, default_tenant="a", on_outcome=lambda m, o: kinds.append(o.kind)))

    @idempotent(broker, task_name="it.native")
    async def double(n: int) -> int:
        return n * 2

    async def scenario() -> tuple[Any, Any]:
        labels = idempotency_labels("k-native")
        with no_thread_hop():
            first = await (await double.kicker().with_labels(**labels).kiq(4)).wait_result(
                timeout=30)
            again = await (await double.kicker().with_labels(**labels).kiq(4)).wait_result(
                timeout=30)
        await store.close()
        return first, again

    first, again = asyncio.run(_with_receiver(broker, scenario()))
    assert (first.return_value, again.return_value) == (8, 8)
    assert kinds == ["executed", "replayed"]
