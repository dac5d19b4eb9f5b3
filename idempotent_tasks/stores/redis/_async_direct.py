"""AsyncRedisStore's hot path: held connections on the store's event loop.

``redis.asyncio.Redis.execute_command`` checks a connection out of the pool under its lock
(with a readiness probe), runs it through the client's retry wrapper and observability
hooks, bounds the send with ``asyncio.wait_for`` (a task of its own per command on Python
3.11) and the read with a timeout of its own, and checks it back in.  ``LoopConnections``
keeps the store's connections instead, built from the client pool's own class and settings
(URL, credentials, TLS, the bounded handshake of ``_client``), hands an idle one to each step
(a list pop), and drives it through redis-py's public ``send_packed_command`` /
``read_response``: redis-py still connects, reconnects and parses.  With hiredis 3 a command
is packed by ``hiredis.pack_command`` in one C call, as the sync store's held connections
do (``_direct.hiredis_packer``: the same bytes as redis-py's packer).  The instruction
counts are in docs/performance.md.

* Deadline: the connections are built without a socket timeout, and each step (its send
  and every reply) runs under one ``asyncio.timeout(socket_timeout)`` here, for speed: one
  timer per step instead of a task and a timer.  When it fires, redis-py drops the
  connection (it disconnects on any exception while sending or reading, a cancellation
  included), so a half-read reply never reaches the next step; the step fails with
  redis-py's ``TimeoutError``.  Nothing is retried here: a retried write could report a
  stale outcome (the handler has its own bounded retry).
* Readiness: as redis-py's pool does at checkout, an idle connection with something to
  read before we sent anything (the server closed it, or it is out of step) is reconnected
  first, through redis-py's non-destructive ``can_read``.
* Event loop: the connections belong to the loop that opened them; a step on another
  running loop forgets them (their sockets belong to that loop) and opens its own.
* Concurrency: a connection serves one step at a time; the transport's semaphore bounds
  the steps in flight, and so the connections, to ``max_connections``.
* Not used for Cluster, Sentinel, a blocking or other custom pool, or RESP3 (push
  notifications): the store then goes through the client's pool as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ._direct import hiredis_packer


class LoopConnections:
    """Connections of one event loop, each lent to one step at a time (see the module
    docstring)."""

    def __init__(self, connection_class: Any, connection_kwargs: dict[str, Any]) -> None:
        kwargs = dict(connection_kwargs)
        #: The step's deadline is ours (one ``asyncio.timeout`` per step, for speed).
        self.timeout: float | None = kwargs.get("socket_timeout")
        kwargs["socket_timeout"] = None
        self._class, self._kwargs = connection_class, kwargs
        #: redis-py's health check (a PING after ``health_check_interval`` idle seconds) is
        #: kept only when the client asked for it.
        self._check_health = bool(kwargs.get("health_check_interval"))
        #: hiredis's packer, called directly when it packs exactly as redis-py would here.
        self._pack = hiredis_packer(kwargs)
        #: redis-py 8's non-destructive probe; older ones name it ``can_read_destructive``.
        self._probe: Callable[[Any], Any] = getattr(
            connection_class, "can_read", None
        ) or connection_class.can_read_destructive
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[Any] = []
        self._all: list[Any] = []

    async def exchange(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write on an idle connection and read every reply (one
        round trip).  Error replies are returned in place, not raised: all replies are read
        either way, so the connection stays in step.  A lost link or a step past the
        deadline raises redis-py's ``ConnectionError`` / ``TimeoutError``."""
        from redis.exceptions import ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        conn = self._checkout()
        replies: list[Any] = []
        try:
            await self._ready(conn)
            async with asyncio.timeout(self.timeout):
                await conn.send_packed_command(
                    self._packed(conn, commands), check_health=self._check_health
                )
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
        except TimeoutError as exc:  # the deadline (built-in): redis-py dropped the connection
            raise RedisTimeoutError(f"no reply within {self.timeout} s") from exc
        finally:
            self._idle.append(conn)
        return replies

    def _packed(self, conn: Any, commands: Sequence[tuple[Any, ...]]) -> list[bytes]:
        """``commands`` packed, as chunks for ``send_packed_command``; a command named in
        two words (``SCRIPT LOAD``) is split by redis-py's packer, so it packs those."""
        pack = self._pack
        if pack is not None:
            if len(commands) == 1 and " " not in commands[0][0]:
                return [pack(commands[0])]
            if not any(" " in cmd[0] for cmd in commands):
                return [b"".join(map(pack, commands))]
        chunks: list[bytes] = conn.pack_commands(commands)
        return chunks

    def _checkout(self) -> Any:
        """An idle connection of the running loop, or a new one (it connects on its first
        send); taken without awaiting, so the caller's ``finally`` always gives it back."""
        if asyncio.get_running_loop() is not self._loop:
            self._loop, self._idle, self._all = asyncio.get_running_loop(), [], []
        if self._idle:
            return self._idle.pop()
        conn = self._class(**self._kwargs)
        self._all.append(conn)
        return conn

    async def _ready(self, conn: Any) -> None:
        """Reconnect ``conn`` if it has something to read before we sent anything."""
        from redis.exceptions import ConnectionError, TimeoutError

        if conn.is_connected:
            try:
                if await self._probe(conn):
                    await conn.disconnect()
            except (ConnectionError, TimeoutError, OSError):
                await conn.disconnect()

    async def close(self) -> None:
        """Disconnect every connection of the running loop; each reconnects on next use."""
        if self._loop is not asyncio.get_running_loop():
            return  # another loop's sockets: not ours to close from here
        for conn in list(self._all):
            await conn.disconnect()


def loop_connections(client: Any) -> LoopConnections | None:
    """Held connections for a standalone ``redis.asyncio.Redis`` with a plain connection
    pool on RESP2; ``None`` (use the client as is) for anything else."""
    import redis.asyncio

    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.asyncio.Redis):
        return None
    if type(pool) is not redis.asyncio.ConnectionPool:
        return None
    if str(pool.connection_kwargs.get("protocol") or 2) != "2":
        return None
    return LoopConnections(pool.connection_class, pool.connection_kwargs)
