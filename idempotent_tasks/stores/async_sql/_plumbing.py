"""AsyncSQLStore's plumbing: the psycopg async pool, the statements' deadline, error
translation, and the SQL text (taken from SQLStore's own statement builders)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..._core.errors import ConfigurationError, IdempotencyError
from ..sql import _statements as q
from ..sql._connections import _break_connection
from ..sql._errors import translate
from ..sql._plumbing import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_SOCKET_TIMEOUT,
    _check_options,
)
from ..sql._postgres import PostgresOps
from ..sql._schema import DEFAULT_TABLE_PREFIX
from ._connections import Connections

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from ._wire import Watchdog, Wire

INSTALL_HINT: Final = (
    "AsyncSQLStore needs psycopg 3 and psycopg_pool: pip install 'idempotent-tasks[postgres]'"
)
_PG_DRIVERS: Final = frozenset({"postgresql", "postgres", "postgresql+psycopg"})
_T = TypeVar("_T")


class _Deadline:
    """Breaks the connection of a statement that outlived its deadline (a silent link):
    the awaited call then fails at once and the store fails closed, like SQLStore's
    watchdog thread — here a timer on the loop, no thread."""

    __slots__ = ("fired", "handle")

    def __init__(self, conn: Any, timeout: float) -> None:
        self.fired = False
        self.handle = asyncio.get_running_loop().call_later(timeout, self._fire, conn)

    def _fire(self, conn: Any) -> None:
        self.fired = True
        _break_connection(conn)


def conninfo_of(url: str) -> str:
    """libpq's URL for a SQLAlchemy-style ``postgresql+psycopg://`` URL (the same strings
    SQLStore takes)."""
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc

    try:
        parsed = sa.make_url(url)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"invalid AsyncSQLStore URL: {exc}") from exc
    if parsed.drivername not in _PG_DRIVERS:
        raise ConfigurationError(
            f"AsyncSQLStore supports PostgreSQL through psycopg 3 (postgresql+psycopg://), not "
            f"{parsed.drivername!r}; SQLite stays on SQLStore"
        )
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def _quoted(prefix: str) -> tuple[str, str, str, str]:
    from sqlalchemy.dialects import postgresql

    quote = postgresql.dialect().identifier_preparer.quote  # type: ignore[no-untyped-call]
    names = ("records", "retry_counters", "locks", "fencing_seq")
    r, c, lk, seq = (quote(f"{prefix}_{t}") for t in names)
    return r, c, lk, seq


class AsyncSQLPlumbing:
    """Everything of AsyncSQLStore but its primitives (see the package docstring)."""

    name = "postgresql"
    #: The engine awaits this store's methods on the event loop (no thread hop).
    is_async = True

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_size: int = DEFAULT_POOL_SIZE,
        socket_timeout: float | None = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        _check_options(table_prefix, connect_timeout, pool_size, socket_timeout)
        try:
            import psycopg
            import psycopg_pool  # noqa: F401  (checked here: the pool is built on first use)
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ConfigurationError(INSTALL_HINT) from exc
        if not isinstance(url, str):
            raise ConfigurationError("AsyncSQLStore takes a postgresql+psycopg:// URL")
        self._url = url
        self._conninfo = conninfo_of(url)
        self.table_prefix = table_prefix
        self._connect_timeout = float(connect_timeout)
        self._pool_size = pool_size
        self._socket_timeout = socket_timeout
        r, c, lk, seq = _quoted(table_prefix)
        self._common = q.Common(r, c, lk, q.pyformat)
        self._ops = PostgresOps(r, c, seq)
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
        self._lost_types: tuple[type[BaseException], ...] = (
            psycopg.OperationalError, psycopg.InterfaceError
        )
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening: asyncio.Task[AsyncConnectionPool[Any]] | None = None
        #: The pool's connections, kept checked out and reused LIFO (``_connections.py``).
        self._conns = Connections(self._get_pool, pool_size, self._connect_timeout)
        #: The statements' deadline: one timer on the oldest in flight (``_wire.py``).
        self._watchdog: Watchdog | None = None
        if socket_timeout is not None:
            from ._wire import Watchdog

            self._watchdog = Watchdog(socket_timeout)

    def __repr__(self) -> str:
        import sqlalchemy as sa

        shown = sa.make_url(self._url).render_as_string(hide_password=True)
        return f"AsyncSQLStore({shown!r}, table_prefix={self.table_prefix!r})"

    # -- the pool -------------------------------------------------------------------------
    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        """The pool, opened on first use (the constructor never connects); concurrent first
        calls share one opening."""
        pool = self._pool
        if pool is not None:
            return pool
        opening = self._opening
        if opening is None:
            opening = self._opening = asyncio.get_running_loop().create_task(self._open())
        try:
            return await asyncio.shield(opening)
        except BaseException:
            if opening.done():
                self._opening = None
            raise

    async def _open(self) -> AsyncConnectionPool[Any]:
        from psycopg_pool import AsyncConnectionPool

        connect = {"autocommit": True, "connect_timeout": max(1, math.ceil(self._connect_timeout))}
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self._conninfo, min_size=1, max_size=self._pool_size, open=False,
            timeout=self._connect_timeout, name=f"idempotent-tasks-{self.table_prefix}",
            kwargs=connect,
        )
        await pool.open(wait=False)
        self._pool = pool
        return pool

    # -- running statements ---------------------------------------------------------------
    def _failure(self, what: str, exc: BaseException) -> IdempotencyError:
        return translate(self.name, self.table_prefix, what, exc)

    async def _acquire(self, what: str) -> Wire:
        """An idle autocommit connection (``_connections.Connections``), translated errors."""
        try:
            return await self._conns.acquire()
        except self._errors as exc:
            raise self._failure(what, exc) from exc

    def _release(self, wire: Wire) -> None:
        self._conns.release(wire)

    async def _run(
        self, what: str, fn: Callable[..., Awaitable[_T]], *args: Any
    ) -> _T:
        """``await fn(wire, *args)`` on an idle autocommit connection, under the deadline;
        driver errors translated (a missing schema → ConfigurationError, the rest →
        STORE_UNAVAILABLE)."""
        wire = await self._acquire(what)
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.start(wire)
        try:
            result = await fn(wire, *args)
        except self._errors as exc:
            if isinstance(exc, self._lost_types) or wire.fired:
                await self._discard(wire, lost=True)
            else:  # e.g. a missing table: the autocommit connection is idle and reusable
                self._release(wire)
            raise self._failure(what, exc) from exc
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            await self._discard(wire, lost=False)
            raise
        finally:
            if watchdog is not None:
                watchdog.stop(wire)
        if wire.fired:  # answered just as the deadline broke it
            await self._discard(wire, lost=False)
        else:
            self._release(wire)
        return result

    async def _discard(self, wire: Wire, *, lost: bool) -> None:
        """Close a connection whose state is unknown; on a lost one (the server restarted,
        the link died) replace every idle connection too, since they died with it."""
        await self._conns.discard(wire)
        if lost:
            await self._conns.drain()

    async def _rowcount(self, what: str, sql: str, params: Mapping[str, Any]) -> int:
        return await self._run(what, rowcount, sql, params)

    async def _one(self, what: str, sql: str, params: Mapping[str, Any]) -> Any:
        return await self._run(what, one, sql, params)

    async def _all(self, what: str, sql: str, params: Mapping[str, Any] | None) -> list[Any]:
        return await self._run(what, rows, sql, params)

    # -- schema (a one-off admin call, on a worker thread) --------------------------------
    async def create_schema(self) -> None:
        """Create what is missing, exactly as ``SQLStore.create_schema`` does (tables,
        indexes, the fencing sequence; idempotent, safe to run concurrently).  A coroutine
        that runs SQLStore's migration on a worker thread: DDL is a deployment step, not the
        hot path (``idempotent-tasks migrate`` does the same from a shell)."""
        await asyncio.to_thread(self._sync_schema, "create_schema")

    async def drop_schema(self) -> None:
        """Drop the store's tables and sequence (tests, decommissioning); idempotent."""
        await asyncio.to_thread(self._sync_schema, "drop_schema")

    def _sync_schema(self, action: str) -> None:
        from ..sql import SQLStore

        twin = SQLStore(
            self._url, table_prefix=self.table_prefix, connect_timeout=self._connect_timeout,
            pool_size=1, socket_timeout=self._socket_timeout,
        )
        try:
            getattr(twin, action)()
        finally:
            twin.close()

    async def close(self) -> None:
        """Close the pool (its connections and tasks); the next call opens a new one."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._pool is not None:
            await self._conns.close()
        self._conns = Connections(self._get_pool, self._pool_size, self._connect_timeout)
        pool, self._pool, self._opening = self._pool, None, None
        if pool is not None:
            await pool.close()


async def one(wire: Wire, sql: str, params: Mapping[str, Any]) -> Any:
    """First row or None."""
    found = wire.rows(await wire.execute(sql, params))
    return found[0] if found else None


async def rows(wire: Wire, sql: str, params: Mapping[str, Any] | None) -> list[Any]:
    return wire.rows(await wire.execute(sql, params))


async def rowcount(wire: Wire, sql: str, params: Mapping[str, Any]) -> int:
    return int((await wire.execute(sql, params)).command_tuples or 0)
