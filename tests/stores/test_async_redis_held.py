"""AsyncRedisStore's held connections (``stores/redis/_async_direct.py``): used for a
store built from a URL, not for a client whose pool must manage its own connections; bounded
by ``max_connections`` under concurrency; each reply to its own caller; a store used from
one event loop after another."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from idempotent_tasks import AsyncRedisStore, IdempotencyHandler

from .._services import REDIS_URL, require
from .._wait import budget

pytestmark = pytest.mark.usefixtures("_redis")


@pytest.fixture
def _redis() -> None:
    require("redis")


def _prefix() -> str:
    return f"ah_{uuid.uuid4().hex[:10]}"


async def _deliver(h: IdempotencyHandler, key: str) -> Any:
    async def body() -> str:
        return f"done {key}"

    return await h.execute_async(body, operation="op", tenant="t", key=key, payload={"k": key})


async def _never() -> str:
    raise AssertionError("a replay runs no body")


async def _drop(store: AsyncRedisStore) -> None:
    await store.drop_schema()
    await store.close()


def test_a_url_store_holds_its_connections_and_a_blocking_pool_is_used_as_is() -> None:
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool.from_url(REDIS_URL, max_connections=4)
    stores = [
        AsyncRedisStore(REDIS_URL, prefix=_prefix()),
        AsyncRedisStore(redis.asyncio.Redis(connection_pool=pool), prefix=_prefix()),
    ]
    assert stores[0]._transport.held is not None
    assert stores[1]._transport.held is None

    async def main() -> None:
        for store in stores:
            h = IdempotencyHandler(store, metrics=None)
            assert await _deliver(h, "a") == "done a"
            assert (await h.run_async(_never, operation="op", tenant="t", key="a",
                                      payload={"k": "a"})).kind == "replayed"
            await _drop(store)
        await stores[1].client.aclose()

    asyncio.run(asyncio.wait_for(main(), budget(30)))


def test_concurrent_deliveries_get_their_own_replies_on_at_most_max_connections() -> None:
    store = AsyncRedisStore(REDIS_URL, prefix=_prefix(), max_connections=3)
    held = store._transport.held
    assert held is not None

    async def main() -> None:
        h = IdempotencyHandler(store, metrics=None)
        keys = [f"k{i}" for i in range(40)]
        first = await asyncio.gather(*(_deliver(h, key) for key in keys))
        again = await asyncio.gather(*(_deliver(h, key) for key in reversed(keys)))
        assert first == [f"done {key}" for key in keys]
        assert again == [f"done {key}" for key in reversed(keys)]
        assert 1 <= len(held._all) <= 3
        await _drop(store)

    asyncio.run(asyncio.wait_for(main(), budget(30)))


def test_a_store_serves_one_event_loop_after_another() -> None:
    store = AsyncRedisStore(REDIS_URL, prefix=_prefix())
    h = IdempotencyHandler(store, metrics=None)
    assert asyncio.run(_deliver(h, "a")) == "done a"
    assert asyncio.run(_deliver(h, "a")) == "done a"  # replayed on the second loop
    assert asyncio.run(_deliver(h, "b")) == "done b"
    asyncio.run(_drop(store))
