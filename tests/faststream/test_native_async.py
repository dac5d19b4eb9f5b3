"""With an async store the FastStream layer makes no thread hop: every store call is awaited
on FastStream's own event loop (proved by forbidding ``asyncio.to_thread``, executors and new
threads while messages are processed), on every broker whose FastStream client is asyncio
(FastStream's confluent broker polls confluent-kafka in a thread of its own)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks import AsyncRedisStore, IdempotencyHandler

from .._services import REDIS_URL, require
from ._harness import MODES, no_thread_hop, running
from ._kits import Kit

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def async_store() -> Iterator[AsyncRedisStore]:
    require("redis")
    yield AsyncRedisStore(REDIS_URL, prefix=f"it_fsa_{uuid.uuid4().hex[:10]}")


@pytest.mark.parametrize("mode", MODES)
def test_no_thread_hop_with_an_async_store(asyncio_kit: Kit, async_store: AsyncRedisStore,
                                           mode: str) -> None:
    kit = asyncio_kit
    handler = IdempotencyHandler(async_store, lease_timeout=5, metrics=None)
    calls: list[Any] = []

    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body)
        if body.get("bad"):
            raise ValueError("bad order")
        return {"charged": body["amount"]}

    async def scenario() -> None:
        await async_store.create_schema()
        dest, dead = kit.destination(), kit.destination("dead")
        try:
            async with running(kit, handler, {dest: charge}, mode=mode, dead_letter=dead,
                               permanent=(ValueError,)) as r:
                with no_thread_hop():
                    await r.publish(dest, {"amount": 5})
                    await r.until(lambda: r.kinds() == ["executed"])
                    await r.publish(dest, {"amount": 5})
                    await r.publish(dest, {"bad": True}, key="k-bad")
                    try:
                        await r.dead.wait(1)
                        await r.until(lambda: len(r.kinds()) == 3)
                    except TimeoutError:
                        raise AssertionError(f"{r.kinds()} {r.dead.items}") from None
        finally:
            await async_store.drop_schema()
            await async_store.close()
        assert sorted(r.kinds()) == ["executed", "poisoned", "replayed"]
        assert calls == [{"amount": 5}, {"bad": True}]

    asyncio.run(scenario())
