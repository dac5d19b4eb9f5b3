"""AsyncSQLStore's change feed: SQLStore's ``LISTEN``/``NOTIFY`` (``stores/sql/_feed.py``:
the same channel and payloads, so sync and async stores sharing tables wake each other) on
the store's own driver.

* ``announce_change``: the ``pg_notify`` plan on one of the store's connections.
* ``wait_for_change``: an ``asyncio.Event`` per waiter, registered under its scope's payload
  before it blocks; one listener task per store and event loop sets them, and the first
  wait does not return before ``LISTEN`` is active (or its timeout passed).  The listener's
  connection is opened with the store's driver, outside the pool: psycopg's
  ``AsyncConnection.notifies(timeout=...)`` in a loop, or asyncpg's ``add_listener`` (with
  ``add_termination_listener`` telling the task that the server closed the connection).
* Failures: as on the sync store — a lost listener is logged (``change_feed_lost``) and
  reopened with a doubling delay, waiters sleep to their timeout meanwhile and are all
  woken once it listens again; a quiet link is checked every ``PING_INTERVAL`` seconds
  (under ``socket_timeout``).  ``close()`` cancels the task and closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

from ..._core.logging import default_logger
from ..._core.records import Scope
from .._feed import scope_digest
from ..sql.protocol import (
    LISTEN_TICK,
    PING_INTERVAL,
    RECONNECT_DELAYS,
    listen_sql,
    listener_name,
)

_log = default_logger()
Dispatch = Callable[[str], None]


class _PsycopgLink:
    """A listening ``psycopg.AsyncConnection``."""

    def __init__(self, conn: Any, dispatch: Dispatch) -> None:
        self.conn = conn
        self.dispatch = dispatch

    @classmethod
    async def open(
        cls, conninfo: str, channel: str, timeout: float, dispatch: Dispatch
    ) -> _PsycopgLink:
        """Connected, with ``LISTEN`` active."""
        import psycopg

        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, application_name=listener_name(channel),
            connect_timeout=max(1, math.ceil(timeout)),
        )
        try:
            await conn.execute(listen_sql(channel))
        except BaseException:
            await conn.close()
            raise
        return cls(conn, dispatch)

    async def serve(self, ping: float | None) -> None:
        """Dispatch payloads until the connection fails (raises)."""
        quiet_since = time.monotonic()
        while True:
            async for note in self.conn.notifies(timeout=LISTEN_TICK):
                self.dispatch(note.payload)
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since >= PING_INTERVAL:
                await asyncio.wait_for(self.conn.execute("SELECT 1"), ping)
                quiet_since = time.monotonic()

    async def close(self) -> None:
        await self.conn.close()


class _AsyncpgLink:
    """A listening asyncpg connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: self.lost.set())

    @classmethod
    async def open(
        cls, dsn: str, channel: str, timeout: float, dispatch: Dispatch
    ) -> _AsyncpgLink:
        """Connected, with ``LISTEN`` active (``add_listener``)."""
        import asyncpg  # type: ignore[import-untyped]

        def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            dispatch(payload)

        conn = await asyncpg.connect(
            dsn, timeout=timeout, server_settings={"application_name": listener_name(channel)}
        )
        try:
            link = cls(conn)
            await conn.add_listener(channel, on_notify)
        except BaseException:
            conn.terminate()
            raise
        return link

    async def serve(self, ping: float | None) -> None:
        """Wait (the payloads come to ``on_notify``) until the server closes the connection."""
        while not self.lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lost.wait(), PING_INTERVAL)
            if not self.lost.is_set():
                await asyncio.wait_for(self.conn.fetchval("SELECT 1"), ping)
        raise ConnectionError("the server closed the listener's connection")

    async def close(self) -> None:
        self.conn.terminate()


class AsyncChangeFeed:
    """The waiters of one store on its event loop, and their listener task."""

    def __init__(
        self, driver: str, conninfo: str, channel: str, *,
        connect_timeout: float, ping_timeout: float | None,
    ) -> None:
        self.channel = channel
        self._link = _PsycopgLink if driver == "psycopg" else _AsyncpgLink
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._ping_timeout = ping_timeout
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def wait(self, scope: Scope, *, timeout: float) -> bool:
        """Register, then wait until the scope's payload arrives or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        payload, event = scope_digest(scope), asyncio.Event()
        self._running(loop)
        self._waiters.setdefault(payload, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._ready.wait()  # LISTEN active before the first look
                    await event.wait()
            return event.is_set()
        finally:
            events = self._waiters.get(payload)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[payload]

    def _running(self, loop: asyncio.AbstractEventLoop) -> None:
        """The listener task, started on first use, and afresh on another loop (the old
        one's task died with it)."""
        task = self._task
        if task is not None and task.get_loop() is loop and not task.done():
            return
        if task is not None and task.get_loop() is not loop:
            self._waiters, self._ready = {}, asyncio.Event()
        self._ready.clear()
        self._task = loop.create_task(self._listen(), name=f"idempotent-tasks-listen-"
                                                         f"{self.channel}")

    def dispatch(self, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    @property
    def listening(self) -> bool:
        """Whether the listener task runs with ``LISTEN`` active."""
        return self._task is not None and not self._task.done() and self._ready.is_set()

    async def _listen(self) -> None:
        delay, opened = RECONNECT_DELAYS[0], 0
        while True:
            link: _PsycopgLink | _AsyncpgLink | None = None
            try:
                link = await self._link.open(
                    self._conninfo, self.channel, self._connect_timeout, self.dispatch
                )
                if opened:  # what was announced while we were away is lost: look again
                    for events in self._waiters.values():
                        for event in events:
                            event.set()
                opened += 1
                delay = RECONNECT_DELAYS[0]
                self._ready.set()
                await link.serve(self._ping_timeout)
            except Exception as exc:
                _log.warning("change_feed_lost", store="postgresql", channel=self.channel,
                             error=repr(exc))
            finally:
                self._ready.clear()
                if link is not None:
                    with contextlib.suppress(Exception):
                        await link.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAYS[1])

    async def close(self) -> None:
        """Cancel the listener task (awaited) and close its connection."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        if task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.CancelledError):
                await task
