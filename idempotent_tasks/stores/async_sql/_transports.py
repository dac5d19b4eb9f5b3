"""AsyncSQLStore's transports: the protocol's plans on psycopg's or asyncpg's public API.

A transport owns a driver's pool and knows how to run a plan on one of its connections,
how to tell a connection it can hand out again, and how to break one whose statement
outlived its deadline.  Nothing here builds SQL or reads a record: that is
``stores/sql/protocol.py``, shared with the sync store.

* psycopg: ``psycopg.AsyncConnection`` (autocommit) from a ``psycopg_pool.AsyncConnectionPool``;
  one cursor per connection, reused; ``prepare=True`` prepares the store's statements on
  their first use (``execute(..., prepare=True)``), ``prepare=False`` sets
  ``prepare_threshold=None`` on every connection (nothing named is ever prepared).  A
  deadline shuts the connection's socket down (``fileno()``): the awaited call fails at once.
* asyncpg: connections of an ``asyncpg.Pool``; statements are asyncpg's ``$n`` form of the
  protocol's ``%(name)s`` text (converted once per text); ``prepare=False`` is
  ``statement_cache_size=0`` (asyncpg then uses only unnamed statements).  A deadline
  ``terminate()``s the connection.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
from typing import Any, Final, TypeVar

from ..sql.protocol import ROWS, Plan, Statement

_T = TypeVar("_T")
_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s")
_IDLE: Final = 0  # psycopg's TransactionStatus.IDLE (an IntEnum)


class Held:
    """A connection the store keeps checked out of the pool, and its deadline state."""

    __slots__ = ("conn", "cursor", "fired", "started")

    def __init__(self, conn: Any, cursor: Any = None) -> None:
        self.conn = conn
        self.cursor = cursor
        #: Set when the deadline broke the connection under a statement.
        self.fired = False
        #: When the statement in flight started (loop time), for the deadline.
        self.started = 0.0


class _Transport:
    """What both drivers share: running a plan, one statement's answer at a time."""

    async def answer(self, held: Held, step: Statement) -> Any:
        raise NotImplementedError

    async def run(self, held: Held, plan: Plan[_T]) -> _T:
        answer = None
        try:
            while True:
                answer = await self.answer(held, plan.send(answer))
        except StopIteration as done:
            result: _T = done.value
            return result


class PsycopgTransport(_Transport):
    """psycopg 3's async connections (see the module docstring)."""

    driver = "psycopg"

    def __init__(self, conninfo: str, *, pool_size: int, timeout: float, prepare: bool,
                 name: str) -> None:
        import psycopg

        self._conninfo, self._size, self._timeout, self._name = conninfo, pool_size, timeout, name
        self._prepare: bool | None = True if prepare else None
        self._connect: dict[str, Any] = {
            "autocommit": True, "connect_timeout": max(1, math.ceil(timeout)),
        }
        if not prepare:
            self._connect["prepare_threshold"] = None
        self.errors: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
        self.lost: tuple[type[BaseException], ...] = (
            psycopg.OperationalError, psycopg.InterfaceError
        )

    async def open_pool(self) -> Any:
        """The pool, opened once a connection of our own was made: the pool connects in the
        background and only logs why it could not (a wrong password, an unknown database), so
        a caller would wait for its whole timeout and learn just ``PoolTimeout``; this
        connection raises the server's own reason within the connect timeout instead."""
        import psycopg
        from psycopg_pool import AsyncConnectionPool

        first = await psycopg.AsyncConnection.connect(self._conninfo, **self._connect)
        await first.close()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self._conninfo, min_size=1, max_size=self._size, open=False,
            timeout=self._timeout, name=self._name, kwargs=self._connect,
        )
        await pool.open(wait=False)
        return pool

    async def hold(self, pool: Any) -> Held:
        conn = await pool.getconn()
        return Held(conn, conn.cursor())

    async def give_back(self, pool: Any, conn: Any) -> None:
        await pool.putconn(conn)

    async def close(self, conn: Any) -> None:
        await conn.close()

    async def drain(self, pool: Any) -> None:
        await pool.drain()

    async def close_pool(self, pool: Any) -> None:
        await pool.close()

    def usable(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken and conn.info.transaction_status == _IDLE

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.info.transaction_status != _IDLE)

    def break_(self, conn: Any) -> None:
        """Shut the socket down under the call in flight (it then fails at once)."""
        with contextlib.suppress(Exception):
            sock = socket.socket(fileno=os.dup(conn.fileno()))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()

    async def command(self, conn: Any, sql: str) -> None:
        await conn.execute(sql)

    async def answer(self, held: Held, step: Statement) -> Any:
        cur, (sql, params, fetch) = held.cursor, step
        await cur.execute(sql, params, prepare=self._prepare)
        return await cur.fetchall() if fetch == ROWS else cur.rowcount


class AsyncpgTransport(_Transport):
    """asyncpg's connections (see the module docstring)."""

    driver = "asyncpg"

    def __init__(self, conninfo: str, *, pool_size: int, timeout: float, prepare: bool,
                 name: str) -> None:
        import asyncpg  # type: ignore[import-untyped]

        self._dsn, self._size, self._timeout = conninfo, pool_size, timeout
        self._options: dict[str, Any] = {} if prepare else {"statement_cache_size": 0}
        self._queries: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.errors: tuple[type[BaseException], ...] = (
            asyncpg.PostgresError, asyncpg.InterfaceError, OSError
        )
        self.lost: tuple[type[BaseException], ...] = (
            asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
            asyncpg.exceptions.OperatorInterventionError, OSError,
        )

    async def open_pool(self) -> Any:
        import asyncpg

        return await asyncpg.create_pool(
            self._dsn, min_size=0, max_size=self._size, timeout=self._timeout,
            command_timeout=None, **self._options,
        )

    async def hold(self, pool: Any) -> Held:
        return Held(await pool.acquire(timeout=self._timeout))

    async def give_back(self, pool: Any, conn: Any) -> None:
        await pool.release(conn, timeout=self._timeout)

    async def close(self, conn: Any) -> None:
        conn.terminate()

    async def drain(self, pool: Any) -> None:
        await pool.expire_connections()

    async def close_pool(self, pool: Any) -> None:
        pool.terminate()

    def usable(self, conn: Any) -> bool:
        """Open and idle (a connection the server closed is detached from its pool proxy:
        asking it anything raises)."""
        try:
            return not conn.is_closed() and not conn.is_in_transaction()
        except Exception:
            return False

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.is_in_transaction())

    def break_(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.terminate()

    async def command(self, conn: Any, sql: str) -> None:
        await conn.execute(sql)

    def _query(self, sql: str) -> tuple[str, tuple[str, ...]]:
        """asyncpg's ``$n`` text of a ``%(name)s`` statement, and the names in order."""
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        query = self._queries[sql] = (_PLACEHOLDER.sub(number, sql), tuple(names))
        return query

    async def answer(self, held: Held, step: Statement) -> Any:
        text, params, fetch = step
        sql, names = self._queries.get(text) or self._query(text)
        args = [params[name] for name in names]
        if fetch == ROWS:
            return await held.conn.fetch(sql, *args)
        return int((await held.conn.execute(sql, *args)).rpartition(" ")[2] or 0)  # "UPDATE 1"


__all__ = ["AsyncpgTransport", "Held", "PsycopgTransport"]
