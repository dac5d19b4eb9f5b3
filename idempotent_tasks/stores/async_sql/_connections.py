"""AsyncSQLStore's connections: the pool's connections, kept checked out and reused LIFO.

``psycopg_pool.AsyncConnectionPool`` connects, reconnects and replaces connections; its
checkout and return (locks, a condition, statistics, logging) cost more than a statement on
loopback, so — like SQLStore's raw free list — a connection stays checked out between calls
here, as a :class:`~._wire.Wire` (its socket registered with the loop).  At most ``size``
are out of the pool at once; a call that finds none idle and the limit reached waits, first
come first served, for the next one released (up to ``timeout`` seconds, then
``TimeoutError``: the store fails closed).  A released connection goes straight to the
oldest waiter, never back into a pool nobody asks; one found broken while idle (the server
closed it) is discarded instead of being handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._wire import Wire

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


class Connections:
    """LIFO reuse of at most ``size`` pool connections (as wires), with FIFO waiters."""

    def __init__(
        self, get_pool: Callable[[], Awaitable[Any]], size: int, timeout: float
    ) -> None:
        self._get_pool = get_pool
        self._size = size
        self._timeout = timeout
        self._idle: deque[Wire] = deque()
        #: Calls waiting for a connection, oldest first, each with its deadline (loop time).
        self._waiters: deque[tuple[asyncio.Future[Wire], float]] = deque()
        #: One timer for every waiter: on the oldest one's deadline (not one per waiter).
        self._expiry: asyncio.TimerHandle | None = None
        self._out = 0  # connections checked out of the pool (idle here or in use)
        self._tasks: set[asyncio.Task[None]] = set()

    async def acquire(self) -> Wire:
        idle = self._idle
        while idle:
            wire = idle.pop()
            if not wire.broken:
                return wire
            await self.discard(wire)  # the server closed it while it was idle
        if self._out < self._size:
            return await self._from_pool()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Wire] = loop.create_future()
        deadline = loop.time() + self._timeout
        self._waiters.append((waiter, deadline))
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire, loop)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())  # handed to us as we were cancelled: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the waiters whose deadline passed; the timer moves to the next one's."""
        self._expiry = None
        waiters, now = self._waiters, loop.time()
        while waiters and (waiters[0][0].done() or waiters[0][1] <= now):
            waiter, _ = waiters.popleft()
            if not waiter.done():
                waiter.set_exception(TimeoutError(
                    f"no database connection free within {self._timeout} s "
                    f"(pool_size {self._size})"
                ))
        if waiters:
            self._expiry = loop.call_at(waiters[0][1], self._expire, loop)

    def _next_waiter(self) -> asyncio.Future[Wire] | None:
        """The oldest call still waiting for a connection, taken off the queue."""
        waiters = self._waiters
        while waiters:
            waiter, _ = waiters.popleft()
            if not waiter.done():
                return waiter
        return None

    async def _from_pool(self) -> Wire:
        from ._wire import Wire

        self._out += 1
        try:
            pool = await self._get_pool()
            conn = await pool.getconn()
        except BaseException:
            self._out -= 1
            raise
        try:
            return Wire(conn, asyncio.get_running_loop())
        except BaseException:
            await self._give_back(conn)
            self._out -= 1
            raise

    def release(self, wire: Wire) -> None:
        """A connection the caller is done with: to the oldest waiter, else idle; one whose
        state is unusable goes back to the pool (which replaces it)."""
        conn = wire.conn
        if wire.broken or conn.closed or conn.info.transaction_status != _IDLE:
            self._spawn(self.discard(wire))
            return
        wire.attach()
        waiter = self._next_waiter()
        if waiter is not None:
            waiter.set_result(wire)
        else:
            self._idle.append(wire)

    async def discard(self, wire: Wire) -> None:
        """Close a connection whose state is unknown and give it back to the pool; a waiter,
        if any, gets a fresh one from the pool."""
        wire.detach()
        with contextlib.suppress(Exception):
            await wire.conn.close()
        await self._give_back(wire.conn)
        self._out -= 1
        if self._waiters:
            self._spawn(self._refill())

    async def _refill(self) -> None:
        try:
            wire = await self._from_pool()
        except Exception as exc:
            waiter = self._next_waiter()
            if waiter is not None:
                waiter.set_exception(exc)
            return
        self.release(wire)

    async def drain(self) -> None:
        """Close every idle connection (they died with one that was lost) and let the pool
        replace its own."""
        idle, self._idle = self._idle, deque()
        for wire in idle:
            await self.discard(wire)
        pool = await self._get_pool()
        with contextlib.suppress(Exception):
            await pool.drain()

    async def close(self) -> None:
        """Give every idle connection back; waiters fail."""
        idle, self._idle = self._idle, deque()
        for wire in idle:
            wire.detach()
            await self._give_back(wire.conn)
            self._out -= 1
        while (waiter := self._next_waiter()) is not None:
            waiter.set_exception(TimeoutError("the store was closed"))
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    async def _give_back(self, conn: Any) -> None:
        with contextlib.suppress(Exception):  # best effort: the pool replaces what it cannot use
            pool = await self._get_pool()
            await pool.putconn(conn)

    def _spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
