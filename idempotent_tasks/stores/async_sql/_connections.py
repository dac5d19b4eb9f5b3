"""AsyncSQLStore's connections: the pool's connections, kept checked out and reused LIFO.

``psycopg_pool.AsyncConnectionPool`` connects, reconnects and replaces connections; its
checkout and return (locks, a condition, statistics, logging) cost more than a statement on
loopback, so — like SQLStore's raw free list — a connection stays checked out between calls
here.  At most ``size`` are out of the pool at once; a call that finds none idle and the
limit reached waits, first come first served, for the next one released (up to
``timeout`` seconds, then ``TimeoutError``: the store fails closed).  A released connection
goes straight to the oldest waiter, never back into a pool nobody asks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


class Connections:
    """LIFO reuse of at most ``size`` pool connections, with FIFO waiters."""

    def __init__(
        self, get_pool: Callable[[], Awaitable[Any]], size: int, timeout: float
    ) -> None:
        self._get_pool = get_pool
        self._size = size
        self._timeout = timeout
        self._idle: deque[Any] = deque()
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self._out = 0  # connections checked out of the pool (idle here or in use)
        self._tasks: set[asyncio.Task[None]] = set()

    async def acquire(self) -> Any:
        idle = self._idle
        if idle:
            return idle.pop()
        if self._out < self._size:
            return await self._from_pool()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._timeout):
                return await waiter
        except TimeoutError:
            raise TimeoutError(
                f"no database connection free within {self._timeout} s (pool_size {self._size})"
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())  # handed to us as we were cancelled: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()

    async def _from_pool(self) -> Any:
        self._out += 1
        try:
            pool = await self._get_pool()
            return await pool.getconn()
        except BaseException:
            self._out -= 1
            raise

    def release(self, conn: Any) -> None:
        """A connection the caller is done with: to the oldest waiter, else idle; one whose
        state is unusable goes back to the pool (which replaces it)."""
        if conn.closed or conn.info.transaction_status != _IDLE:
            self._spawn(self.discard(conn))
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    async def discard(self, conn: Any) -> None:
        """Close a connection whose state is unknown and give it back to the pool; a waiter,
        if any, gets a fresh one from the pool."""
        with contextlib.suppress(Exception):
            await conn.close()
        await self._give_back(conn)
        self._out -= 1
        if self._waiters:
            self._spawn(self._refill())

    async def _refill(self) -> None:
        try:
            conn = await self._from_pool()
        except Exception as exc:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(exc)
                    return
            return
        self.release(conn)

    async def drain(self) -> None:
        """Close every idle connection (they died with one that was lost) and let the pool
        replace its own."""
        idle, self._idle = self._idle, deque()
        for conn in idle:
            await self.discard(conn)
        pool = await self._get_pool()
        with contextlib.suppress(Exception):
            await pool.drain()

    async def close(self) -> None:
        """Give every idle connection back; waiters fail."""
        idle, self._idle = self._idle, deque()
        for conn in idle:
            await self._give_back(conn)
            self._out -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(TimeoutError("the store was closed"))

    async def _give_back(self, conn: Any) -> None:
        with contextlib.suppress(Exception):  # best effort: the pool replaces what it cannot use
            pool = await self._get_pool()
            await pool.putconn(conn)

    def _spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
