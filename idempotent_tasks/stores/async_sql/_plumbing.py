"""AsyncSQLStore's plumbing: choosing the transport, the held connections, the statements'
deadline, error translation, and the schema (SQLStore's migration on a worker thread)."""

from __future__ import annotations

import asyncio
from typing import Any, Final, TypeVar

from ..._core.errors import ConfigurationError, IdempotencyError
from ..._core.records import Scope
from ..sql.protocol import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_SOCKET_TIMEOUT,
    DEFAULT_TABLE_PREFIX,
    Plan,
    channel_name,
    check_options,
    check_schema,
    listen_conninfo,
    notify_plan,
    postgres_plans,
    schema_objects,
    translate,
)
from ._connections import Connections
from ._deadline import Watchdog
from ._feed import AsyncChangeFeed
from ._transports import AsyncpgTransport, Held, PsycopgTransport

#: The driver behind a plain ``postgresql://`` URL (the faster one, see docs/performance.md).
DEFAULT_DRIVER: Final = "asyncpg"
_DRIVERS: Final = {
    "postgresql": None, "postgres": None,
    "postgresql+psycopg": "psycopg", "postgresql+asyncpg": "asyncpg",
}
_HINTS: Final = {
    "psycopg": "AsyncSQLStore on psycopg needs psycopg 3 and psycopg_pool: "
    "pip install 'idempotent-tasks[postgres]'",
    "asyncpg": "AsyncSQLStore on asyncpg needs asyncpg: pip install 'idempotent-tasks[asyncpg]'",
}
_T = TypeVar("_T")


def parse_url(url: str) -> tuple[str, str]:
    """The driver a URL selects, and the libpq-style URL both drivers take."""
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc

    if not isinstance(url, str):
        raise ConfigurationError("AsyncSQLStore takes a postgresql+asyncpg:// or "
                                 "postgresql+psycopg:// URL")
    try:
        parsed = sa.make_url(url)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"invalid AsyncSQLStore URL: {exc}") from exc
    if parsed.drivername not in _DRIVERS:
        raise ConfigurationError(
            "AsyncSQLStore supports PostgreSQL through asyncpg (postgresql+asyncpg://) or "
            f"psycopg 3 (postgresql+psycopg://), not {parsed.drivername!r}; SQLite stays on "
            "SQLStore"
        )
    driver = _DRIVERS[parsed.drivername] or _installed_default()
    return driver, parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def _quote(name: str) -> str:
    """PostgreSQL's quoting of an identifier (as ``postgres_plans`` quotes the tables)."""
    from sqlalchemy.dialects import postgresql

    quoted: str = postgresql.dialect().identifier_preparer.quote(name)  # type: ignore[no-untyped-call]
    return quoted


def _installed_default() -> str:
    """``DEFAULT_DRIVER``, or the other one when only that one is installed."""
    import importlib.util

    if importlib.util.find_spec(DEFAULT_DRIVER) is not None:
        return DEFAULT_DRIVER
    return "psycopg" if DEFAULT_DRIVER == "asyncpg" else "asyncpg"


class AsyncSQLPlumbing:
    """Everything of AsyncSQLStore but its primitives (see the package docstring)."""

    name = "postgresql"
    #: The change feed (``_feed.py``), where ``LISTEN`` can work.
    _feed: AsyncChangeFeed | None = None

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_size: int = DEFAULT_POOL_SIZE,
        socket_timeout: float | None = DEFAULT_SOCKET_TIMEOUT,
        prepare: bool = True,
        require_synchronous_replication: bool = False,
        listen_url: str | None = None,
    ) -> None:
        check_options(table_prefix, connect_timeout, pool_size, socket_timeout)
        #: Every connection taken from the pool checks that commits wait for a standby.
        self._replication_check = require_synchronous_replication
        self.driver, conninfo = parse_url(url)
        self._url = url
        self.table_prefix = table_prefix
        self.prepare = bool(prepare)
        self._connect_timeout = float(connect_timeout)
        self._pool_size = pool_size
        self._socket_timeout = socket_timeout
        self._plans = postgres_plans(table_prefix)
        #: Checked whole on first use (``sql.protocol.check_schema``), then never again.
        self._unchecked = schema_objects(_quote, table_prefix)
        self._common = self._plans.common
        kind = PsycopgTransport if self.driver == "psycopg" else AsyncpgTransport
        try:
            self._transport: PsycopgTransport | AsyncpgTransport = kind(
                conninfo, pool_size=pool_size, timeout=self._connect_timeout,
                prepare=self.prepare, name=f"idempotent-tasks-{table_prefix}",
            )
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise ConfigurationError(_HINTS[self.driver]) from exc
        self._errors = self._transport.errors
        self._lost_types = self._transport.lost
        self._pool: Any = None
        self._opening: asyncio.Task[Any] | None = None
        #: The pool's connections, kept checked out and reused LIFO (``_connections.py``).
        self._conns = self._new_connections()
        #: The statements' deadline: one timer on the oldest in flight (``_deadline.py``).
        self._watchdog = (
            None if socket_timeout is None else Watchdog(socket_timeout, self._transport.break_)
        )
        self._start_feed(conninfo, listen_url)

    def _start_feed(self, conninfo: str, listen_url: str | None) -> None:
        """As on SQLStore, the feed's two coroutine methods are set on the instance: behind
        PgBouncer (``prepare=False``) without ``listen_url`` the store has neither, and
        ``isinstance(store, AsyncChangeFeedStore)`` is False (its waiters poll)."""
        if listen_url is None and not self.prepare:
            return
        self._channel = channel_name(self.table_prefix)
        self._feed = feed = AsyncChangeFeed(
            self.driver, conninfo if listen_url is None else listen_conninfo(listen_url),
            self._channel, connect_timeout=self._connect_timeout,
            ping_timeout=self._socket_timeout,
        )
        self.announce_change = self._announce_change
        self.wait_for_change = feed.wait

    async def _announce_change(self, scope: Scope) -> None:
        """Wake ``scope``'s waiters in every process listening on this store's channel:
        one ``pg_notify`` (``stores/sql/_feed.py``)."""
        await self._execute("announce_change", notify_plan(self._channel, scope))

    def _new_connections(self) -> Connections:
        return Connections(self._transport, self._get_pool, self._pool_size,
                           self._connect_timeout, check=self._replication_check)

    def __repr__(self) -> str:
        import sqlalchemy as sa

        shown = sa.make_url(self._url).render_as_string(hide_password=True)
        return f"AsyncSQLStore({shown!r}, table_prefix={self.table_prefix!r})"

    # -- the pool -------------------------------------------------------------------------
    async def _get_pool(self) -> Any:
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

    async def _open(self) -> Any:
        self._pool = await self._transport.open_pool()
        return self._pool

    # -- running plans --------------------------------------------------------------------
    def _failure(self, what: str, exc: BaseException) -> IdempotencyError:
        return translate(self.name, self.table_prefix, what, exc)

    async def _acquire(self, what: str) -> Held:
        """An idle autocommit connection (``_connections.Connections``), translated errors."""
        try:
            return await self._conns.acquire()
        except self._errors as exc:
            raise self._failure(what, exc) from exc

    def _release(self, held: Held) -> None:
        self._conns.release(held)

    async def _execute(self, what: str, plan: Plan[_T]) -> _T:
        """Run a primitive's plan (``protocol.py``) on an idle autocommit connection, under
        the deadline; driver errors translated (a missing schema → ConfigurationError, the
        rest → STORE_UNAVAILABLE)."""
        held = await self._acquire(what)
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.start(held)
        try:
            if self._unchecked:
                await self._transport.run(held, check_schema(self._unchecked))
                self._unchecked = ()
            result = await self._transport.run(held, plan)
        except self._errors as exc:
            if isinstance(exc, self._lost_types) or held.fired:
                await self._discard(held, lost=True)
            else:  # e.g. a missing table: the autocommit connection is idle and reusable
                self._release(held)
            raise self._failure(what, exc) from exc
        except BaseException:  # cancelled mid-statement: the connection's state is unknown
            await self._discard(held, lost=False)
            raise
        finally:
            if watchdog is not None:
                watchdog.stop(held)
        if held.fired:  # answered just as the deadline broke it
            await self._discard(held, lost=False)
        else:
            self._release(held)
        return result

    async def _discard(self, held: Held, *, lost: bool) -> None:
        """Close a connection whose state is unknown; on a lost one (the server restarted,
        the link died) replace every idle connection too, since they died with it."""
        await self._conns.discard(held)
        if lost:
            await self._conns.drain()

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
        import sqlalchemy as sa

        from ..sql import SQLStore

        parsed = sa.make_url(self._url).set(drivername="postgresql+psycopg")
        url = parsed.render_as_string(hide_password=False)
        twin = SQLStore(
            url, table_prefix=self.table_prefix, connect_timeout=self._connect_timeout,
            pool_size=1, socket_timeout=self._socket_timeout, prepare=self.prepare,
        )
        try:
            getattr(twin, action)()
        finally:
            twin.close()

    async def close(self) -> None:
        """Close the pool (its connections and tasks) and stop the change feed's listener;
        the next call opens a new one."""
        if self._feed is not None:
            await self._feed.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._pool is not None:
            await self._conns.close()
        self._conns = self._new_connections()
        pool, self._pool, self._opening = self._pool, None, None
        if pool is not None:
            await self._transport.close_pool(pool)
