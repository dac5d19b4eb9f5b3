"""AsyncSQLStore's connections: the pool's connections, kept checked out and reused LIFO.

``psycopg_pool.AsyncConnectionPool`` connects, reconnects and replaces connections; its
checkout and return (locks, a condition, statistics, logging) cost more than a statement on
loopback, so — like SQLStore's raw free list — a connection stays checked out between calls
here, as a :class:`~._transports.Held` (the same holds for asyncpg's pool).  At most ``size``
are out of the pool at once; a call that finds none idle and the limit reached waits, first
come first served, for the next one released (up to ``timeout`` seconds, then
``TimeoutError``: the store fails closed).  A released connection goes straight to the
oldest waiter, never back into a pool nobody asks; one the driver knows to be closed (asyncpg
reads the server's goodbye while idle; psycopg learns it on the next statement) is discarded
instead of being handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..sql.protocol import acheck_synchronous_replication

if TYPE_CHECKING:
    from ._transports import AsyncpgTransport, Held, PsycopgTransport


class Connections:
    """LIFO reuse of at most ``size`` pool connections, with FIFO waiters."""

    def __init__(
        self, transport: PsycopgTransport | AsyncpgTransport,
        get_pool: Callable[[], Awaitable[Any]], size: int, timeout: float, *,
        check: bool = False,
    ) -> None:
        self._transport = transport
        #: ``require_synchronous_replication``: each connection from the pool is checked.
        self._check = check
        self._get_pool = get_pool
        self._size = size
        self._timeout = timeout
        self._idle: deque[Held] = deque()
        #: Calls waiting for a connection, oldest first, each with its deadline (loop time).
        self._waiters: deque[tuple[asyncio.Future[Held], float]] = deque()
        #: One timer for every waiter: on the oldest one's deadline (not one per waiter).
        self._expiry: asyncio.TimerHandle | None = None
        self._out = 0  # connections checked out of the pool (idle here or in use)
        self._tasks: set[asyncio.Task[None]] = set()

    async def acquire(self) -> Held:
        idle = self._idle
        while idle:
            held = idle.pop()
            if self._transport.usable(held.conn):
                return held
            await self.discard(held)  # the server closed it while it was idle
        if self._out < self._size:
            return await self._from_pool()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Held] = loop.create_future()
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

    def _next_waiter(self) -> asyncio.Future[Held] | None:
        """The oldest call still waiting for a connection, taken off the queue."""
        waiters = self._waiters
        while waiters:
            waiter, _ = waiters.popleft()
            if not waiter.done():
                return waiter
        return None

    async def _from_pool(self) -> Held:
        self._out += 1
        try:
            held = await self._transport.hold(await self._get_pool())
        except BaseException:
            self._out -= 1
            raise
        if self._check:
            try:
                await acheck_synchronous_replication(held.conn)
            except BaseException:
                self.release(held)
                raise
        return held

    def release(self, held: Held) -> None:
        """A connection the caller is done with: to the oldest waiter, else idle; one whose
        state is unusable goes back to the pool (which replaces it)."""
        if not self._transport.usable(held.conn):
            self._spawn(self.discard(held))
            return
        waiter = self._next_waiter()
        if waiter is not None:
            waiter.set_result(held)
        else:
            self._idle.append(held)

    async def discard(self, held: Held) -> None:
        """Close a connection whose state is unknown and give it back to the pool; a waiter,
        if any, gets a fresh one from the pool."""
        with contextlib.suppress(Exception):
            await self._transport.close(held.conn)
        await self._give_back(held.conn)
        self._out -= 1
        if self._waiters:
            self._spawn(self._refill())

    async def _refill(self) -> None:
        try:
            held = await self._from_pool()
        except Exception as exc:
            waiter = self._next_waiter()
            if waiter is not None:
                waiter.set_exception(exc)
            return
        self.release(held)

    async def drain(self) -> None:
        """Close every idle connection (they died with one that was lost) and let the pool
        replace its own."""
        idle, self._idle = self._idle, deque()
        for held in idle:
            await self.discard(held)
        pool = await self._get_pool()
        with contextlib.suppress(Exception):
            await self._transport.drain(pool)

    async def close(self) -> None:
        """Give every idle connection back; waiters fail."""
        idle, self._idle = self._idle, deque()
        for held in idle:
            await self._give_back(held.conn)
            self._out -= 1
        while (waiter := self._next_waiter()) is not None:
            waiter.set_exception(TimeoutError("the store was closed"))
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    async def _give_back(self, conn: Any) -> None:
        with contextlib.suppress(Exception):  # best effort: the pool replaces what it cannot use
            await self._transport.give_back(await self._get_pool(), conn)

    def _spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
