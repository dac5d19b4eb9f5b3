"""AsyncRedisStore's hot path: a free list of ``redis.asyncio`` connections of its own.

``redis.asyncio.Redis.execute_command`` checks a connection out of the client's pool and
back in, wraps the call in its retry and observability layers and a timeout per step: on
this project's machine that is a large share of a loopback round trip, paid for every
script.  ``HeldConnections`` keeps idle connections — built from the client pool's own class
and settings (URL, credentials, TLS, timeouts) — in a LIFO list and sends each command with
``send_command`` + ``read_response``; redis-py still packs, parses, connects, reconnects and
applies the socket timeouts.  At most ``limit`` commands are in flight (more wait for a free
slot), so at most ``limit`` connections exist.

* Failures: redis-py disconnects a connection on any error while sending or reading
  (timeouts, resets, cancellation), so such a connection is dropped, never reused half-read;
  a server error reply (``NOSCRIPT``, ``ERR``) leaves it usable and is raised.  Nothing is
  retried here: a retried write could report a stale outcome.
* Used for a standalone ``redis.asyncio.Redis`` with a plain ``ConnectionPool`` only (the
  store builds one from a URL); any other client is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any


class HeldConnections:
    """Idle connections in a LIFO list; ``execute(*args)`` runs one command on one."""

    def __init__(self, pool: Any, limit: int) -> None:
        self._pool = pool
        self._class = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._idle: deque[Any] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._response_error, self._lost = _driver_errors()

    async def execute(self, *args: Any) -> Any:
        async with self._slots:
            idle = self._idle
            conn = idle.pop() if idle else self._class(**self._kwargs)
            try:
                await conn.send_command(*args)
                reply = await conn.read_response()
            except self._response_error:
                idle.append(conn)  # an error reply: the connection read it whole
                raise
            except self._lost:
                await _drop(conn)
                await self.drain()  # the others died with it (a restart, a failover)
                raise
            except BaseException:
                await _drop(conn)
                raise
            idle.append(conn)
            return reply

    async def drain(self) -> None:
        """Disconnect every idle connection, ours and the client pool's."""
        while self._idle:
            await _drop(self._idle.pop())
        with contextlib.suppress(Exception):
            await self._pool.disconnect(inuse_connections=False)

    async def close(self) -> None:
        while self._idle:
            await _drop(self._idle.pop())


async def _drop(conn: Any) -> None:
    with contextlib.suppress(Exception):  # already broken: nothing more to release
        await conn.disconnect(nowait=True)


def _driver_errors() -> tuple[type[Exception], tuple[type[BaseException], ...]]:
    """The error reply type, and the errors that mean the connection is gone."""
    from redis.exceptions import ConnectionError, ResponseError, TimeoutError

    return ResponseError, (ConnectionError, TimeoutError, OSError)


def held_connections(client: Any, limit: int) -> HeldConnections | None:
    """Held connections for a ``redis.asyncio.Redis`` with a plain connection pool; ``None``
    (use the client as is) for any other pool, whose connections it must manage itself."""
    import redis.asyncio

    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.asyncio.Redis):
        return None
    if type(pool) is not redis.asyncio.ConnectionPool:
        return None
    return HeldConnections(pool, limit)
