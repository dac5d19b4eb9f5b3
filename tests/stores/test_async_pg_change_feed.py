"""AsyncSQLStore's change feed on both drivers (asyncpg ``add_listener``, psycopg
``AsyncConnection.notifies``): the async twins of ``test_pg_change_feed.py``, and the sync and
async stores waking each other (one channel, one payload format).

A waiter is known to be registered from the feed's registry, never by sleeping; a wait that
must be woken has a timeout far beyond its budget, so True can only come from the wake-up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import SQLStore
from idempotent_tasks.stores import AsyncChangeFeedStore, ChangeFeedStore, Scope
from idempotent_tasks.stores._feed import scope_digest

from .._services import PGBOUNCER_URL, POSTGRES_URL, require
from .._wait import budget
from ..conftest import unique_prefix
from .test_async_sql_transports import DRIVERS, _url
from .test_pg_change_feed import LONG, A, B, _admin, _listener_pids

pytestmark = pytest.mark.postgres


def _store(driver: str, url: str | None = None, **kw: Any) -> Any:
    require("postgres")
    pytest.importorskip(driver)
    from idempotent_tasks import AsyncSQLStore

    kw.setdefault("table_prefix", unique_prefix("afeed"))
    return AsyncSQLStore(url or _url(driver), **kw)


def _run(driver: str, body: Callable[[Any], Awaitable[None]], **kw: Any) -> None:
    """``body(store)`` on a fresh store with its schema, dropped afterwards."""
    store = _store(driver, **kw)

    async def main() -> None:
        await store.create_schema()
        try:
            await asyncio.wait_for(body(store), budget(60))
        finally:
            await store.close()
            await store.drop_schema()

    asyncio.run(main())


async def _registered(store: Any, scope: Scope) -> None:
    """Until a waiter of ``scope`` is registered and the listener listens."""
    feed = store._feed
    async with asyncio.timeout(budget(10)):
        while not (feed.listening and scope_digest(scope) in feed._waiters):
            await asyncio.sleep(0.01)  # polling state the loop's other tasks produce


async def _woken(waiter: asyncio.Task[bool]) -> bool:
    async with asyncio.timeout(budget(10)):
        return await waiter


async def _wakes(
    store: Any, scope: Scope, announce: Callable[[Scope], Awaitable[None]] | None = None
) -> None:
    """A waiting task of ``scope`` is woken by an announcement (``announce``, by default
    the store's own)."""
    waiter = asyncio.ensure_future(store.wait_for_change(scope, timeout=LONG))
    await _registered(store, scope)
    await (announce or store.announce_change)(scope)
    assert await _woken(waiter) is True


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_announcement_wakes_a_waiting_task(driver: str) -> None:
    async def body(store: Any) -> None:
        assert isinstance(store, AsyncChangeFeedStore)
        await _wakes(store, A)

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_wait_without_an_announcement_times_out_false(driver: str) -> None:
    async def body(store: Any) -> None:
        assert await store.wait_for_change(A, timeout=0.2) is False
        assert store._feed.listening  # the first wait listened

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_announcement_wakes_only_its_own_scope(driver: str) -> None:
    async def body(store: Any) -> None:
        a = asyncio.ensure_future(store.wait_for_change(A, timeout=LONG))
        b = asyncio.ensure_future(store.wait_for_change(B, timeout=LONG))
        await _registered(store, A)
        await _registered(store, B)
        await store.announce_change(B)
        assert await _woken(b) is True  # B's notification has been dispatched
        assert not a.done()
        events = store._feed._waiters[scope_digest(A)]
        assert events and not any(event.is_set() for event in events)
        await store.announce_change(A)
        assert await _woken(a) is True

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_many_waiters_share_one_listener_connection(driver: str) -> None:
    async def body(store: Any) -> None:
        scopes = [Scope("acme", "op", f"k-{i}") for i in range(12)]
        waiters = [asyncio.ensure_future(store.wait_for_change(s, timeout=LONG))
                   for s in scopes]
        for scope in scopes:
            await _registered(store, scope)
        assert len(await asyncio.to_thread(_listener_pids, store)) == 1
        for scope in scopes:
            await store.announce_change(scope)
        assert [await _woken(w) for w in waiters] == [True] * len(scopes)

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_listener_reconnects_after_its_backend_is_terminated(driver: str) -> None:
    async def body(store: Any) -> None:
        stranded = asyncio.ensure_future(store.wait_for_change(A, timeout=LONG))
        await _registered(store, A)
        (pid,) = await asyncio.to_thread(_listener_pids, store)
        await asyncio.to_thread(_admin, "SELECT pg_terminate_backend(%s)", pid)
        assert await _woken(stranded) is True  # woken once listening again
        await _wakes(store, B)
        assert await asyncio.to_thread(_listener_pids, store) not in ([], [pid])

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_close_ends_the_listener_task_and_its_connection(driver: str) -> None:
    async def body(store: Any) -> None:
        assert await store.wait_for_change(A, timeout=0.05) is False
        task = store._feed._task
        await store.close()
        assert task.done()
        async with asyncio.timeout(budget(10)):
            while await asyncio.to_thread(_listener_pids, store):
                await asyncio.sleep(0.02)  # the server ends the backend after the close
        await _wakes(store, A)

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_sync_and_async_stores_wake_each_other(driver: str) -> None:
    async def body(store: Any) -> None:
        sync = SQLStore(POSTGRES_URL, table_prefix=store.table_prefix)
        try:
            await _wakes(store, A, lambda scope: asyncio.to_thread(sync.announce_change, scope))
            answers: list[bool] = []
            thread = threading.Thread(
                target=lambda: answers.append(sync.wait_for_change(B, timeout=LONG))
            )
            thread.start()
            while not (sync._feed.listening and scope_digest(B) in sync._feed.waiters._events):
                await asyncio.sleep(0.01)  # polling the other thread's registration
            await store.announce_change(B)
            await asyncio.to_thread(thread.join, budget(10))
            assert answers == [True]
        finally:
            sync.close()

    _run(driver, body)


@pytest.mark.parametrize("driver", DRIVERS)
def test_behind_pgbouncer_the_feed_needs_listen_url(driver: str) -> None:
    require("pgbouncer")
    bouncer = sa.make_url(PGBOUNCER_URL).set(drivername=f"postgresql+{driver}")
    bouncer = bouncer.render_as_string(hide_password=False)
    polling = _store(driver, bouncer, prepare=False)
    assert not isinstance(polling, AsyncChangeFeedStore)
    assert not isinstance(polling, ChangeFeedStore)
    assert not hasattr(polling, "wait_for_change")

    async def body(store: Any) -> None:
        assert isinstance(store, AsyncChangeFeedStore)
        await _wakes(store, A)  # pg_notify through PgBouncer

    _run(driver, body, url=bouncer, prepare=False, listen_url=POSTGRES_URL)
