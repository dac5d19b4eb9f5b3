"""AsyncRedisStore's change feed on the real Redis: the twins of ``test_redis_feed.py``, one
listener task per store and event loop, and announcements heard across the sync and async
stores.

Each test runs one event loop (``asyncio.run``) and looks at Redis through an async client,
so nothing blocks the loop the listener runs on.  Waits poll state, never sleep for an
announcement to arrive.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from idempotent_tasks import AsyncRedisStore, StoreUnavailableError
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores._feed import scope_digest
from idempotent_tasks.stores.changes import AsyncChangeFeedStore
from idempotent_tasks.stores.redis._pubsub import feed_channel

from .._services import REDIS_URL, require
from .._wait import budget
from .test_redis_feed import ANNOUNCE_IN_A_CHILD, A, B, subscriber_ids

pytest.importorskip("redis")
from redis.asyncio import Redis

pytestmark = pytest.mark.redis


class Feed:
    """An async store on a client named after the test, and a client to look at Redis."""

    def __init__(self) -> None:
        self.name = f"afeed-{uuid.uuid4().hex[:10]}"
        self.client = Redis.from_url(REDIS_URL, client_name=self.name)
        self.store = AsyncRedisStore(self.client, prefix=f"raf_{uuid.uuid4().hex[:10]}")
        self.raw = Redis.from_url(REDIS_URL)
        self.channel = feed_channel(self.store.prefix)

    async def subscribers(self) -> list[int]:
        return subscriber_ids(await self.raw.client_list(), self.name)

    async def numsub(self) -> int:
        return int((await self.raw.pubsub_numsub(self.channel))[0][1])

    async def started(self, *scopes: Scope, timeout: float = 60.0) -> list[asyncio.Task[bool]]:
        """Waiters of ``scopes``, once registered and subscribed."""
        tasks = [
            asyncio.create_task(self.store.wait_for_change(s, timeout=budget(timeout)))
            for s in scopes
        ]
        feed = self.store._feed
        await until(
            lambda: feed.subscribed() and all(feed.pending(scope_digest(s)) for s in scopes),
            "the waiters registered and subscribed",
        )
        return tasks

    async def aclose(self) -> None:
        await self.store.close()
        await self.client.aclose()
        await self.raw.aclose()


async def until(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + budget(timeout)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # polling state the listener task produces


async def until_async(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + budget(10)
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # polling the server's view


async def result(task: asyncio.Task[bool]) -> bool:
    return await asyncio.wait_for(task, budget(10))


def run(test: Callable[[Feed], Coroutine[Any, Any, None]]) -> None:
    require("redis")

    async def main() -> None:
        feed = Feed()
        try:
            await test(feed)
        finally:
            await feed.aclose()

    asyncio.run(asyncio.wait_for(main(), budget(90)))


def test_the_async_redis_store_is_an_async_change_feed_store() -> None:
    assert isinstance(AsyncRedisStore(REDIS_URL), AsyncChangeFeedStore)


def test_an_announcement_wakes_a_waiting_task() -> None:
    async def test(feed: Feed) -> None:
        [waiter] = await feed.started(A)
        await feed.store.announce_change(A)
        assert await result(waiter) is True

    run(test)


def test_a_sync_store_in_another_process_wakes_an_async_waiter() -> None:
    async def test(feed: Feed) -> None:
        [waiter] = await feed.started(A)
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ANNOUNCE_IN_A_CHILD, REDIS_URL, feed.store.prefix, *A
        )
        assert await asyncio.wait_for(child.wait(), budget(60)) == 0
        assert await result(waiter) is True

    run(test)


def test_a_wait_nobody_announces_returns_false_at_its_timeout() -> None:
    async def test(feed: Feed) -> None:
        start = time.monotonic()
        assert await feed.store.wait_for_change(A, timeout=0.05) is False
        assert time.monotonic() - start >= 0.05
        assert feed.store._feed.pending(scope_digest(A)) == 0

    run(test)


def test_another_scopes_announcement_does_not_wake_a_waiter() -> None:
    async def test(feed: Feed) -> None:
        waiter_a, waiter_b = await feed.started(A, B)
        await feed.store.announce_change(B)
        assert await result(waiter_b) is True
        # one message is dispatched in one step of the listener: A would be woken by now
        assert feed.store._feed.pending(scope_digest(A)) == 1
        await feed.store.announce_change(A)
        assert await result(waiter_a) is True

    run(test)


def test_many_waiters_share_one_subscriber_connection() -> None:
    async def test(feed: Feed) -> None:
        scopes = [Scope("acme", "op", f"k{i % 5}") for i in range(20)]
        waiters = await feed.started(*scopes)
        assert len(await feed.subscribers()) == 1
        assert await feed.numsub() == 1
        for scope in scopes[:5]:
            await feed.store.announce_change(scope)
        assert [await result(w) for w in waiters] == [True] * 20

    run(test)


def test_the_subscription_comes_back_after_the_server_kills_it() -> None:
    async def test(feed: Feed) -> None:
        [first] = await feed.started(A)
        [killed] = await feed.subscribers()
        await feed.raw.client_kill_filter(_id=killed)
        assert await result(first) is True  # subscribed again, every waiter looks again
        assert (await feed.subscribers()) not in ([], [killed])
        [second] = await feed.started(B)
        await feed.store.announce_change(B)
        assert await result(second) is True

    run(test)


def test_close_cancels_the_listener_and_a_later_wait_subscribes_again() -> None:
    async def test(feed: Feed) -> None:
        [waiter] = await feed.started(A)
        [listener] = [f.task for f in feed.store._feed._loops.values()]
        await feed.store.close()
        assert listener is not None and listener.done()
        assert await result(waiter) is True  # woken by close (it looks again)

        async def unsubscribed() -> bool:
            return await feed.numsub() == 0

        await until_async(unsubscribed, "the subscription closed")
        [again] = await feed.started(B)
        await feed.store.announce_change(B)
        assert await result(again) is True

    run(test)


def test_a_server_that_is_down_fails_announce_and_lets_waits_time_out() -> None:
    async def main() -> None:
        store = AsyncRedisStore("redis://127.0.0.1:1/0", connect_timeout=0.5)
        try:
            with pytest.raises(StoreUnavailableError):
                await store.announce_change(A)
            assert await store.wait_for_change(A, timeout=0.2) is False
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), budget(30)))
