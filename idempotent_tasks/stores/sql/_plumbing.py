"""SQLStore's plumbing: construction, running a statement on a raw connection with its
errors translated, and SQLAlchemy transactions (schema changes, the transactional mode's
body transactions)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, RootTransaction

from ..._core.errors import ConfigurationError, IdempotencyError
from ..._core.records import Scope
from . import _statements as q
from ._connections import (
    _always,
    _dialect_name,
    _make_engine,
    _pg_adopt,
    _pg_restore,
    _Raw,
    _RawPool,
    _sqlite_configure,
    _sqlite_restore,
    _Watchdog,
)
from ._dialects import check_schema, dialect_plans, drive, schema_objects
from ._errors import translate
from ._feed import ChangeFeed, notify_plan, sync_feed
from ._mysql_setup import begin_body, make_adopt, mysql_metadata
from ._plans import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_SOCKET_TIMEOUT,
    Plan,
    check_options,
)
from ._replication import check_synchronous_replication
from ._schema import DEFAULT_TABLE_PREFIX, build_metadata
from ._sqlite import BEGIN, fencing_table

_PG_IDLE: Final = 0  # psycopg's TransactionStatus.IDLE

_T = TypeVar("_T")


class SQLBodyTransaction:
    """The transactional mode's transaction: the body's writes and the conditional SUCCESS
    commit together."""

    def __init__(
        self,
        store: SQLPlumbing,
        connection: Connection,
        transaction: RootTransaction,
        driver_in_transaction: Callable[[], bool],
    ) -> None:
        self.connection = connection
        self._store = store
        self._transaction = transaction
        self._driver_in_transaction = driver_in_transaction

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """Conditional on PROCESSING + our token; refuses to run outside our transaction, so
        a success can never be committed apart from the body's writes."""
        q.check_intact(self.is_intact(), scope)
        plan = self._store._plans.mark_success(
            scope, token=token, response=response, now=now, expires_at=expires_at
        )
        with (
            self._store._translated("mark_success"),
            contextlib.closing(self.connection.connection.cursor()) as cursor,
        ):
            return drive(cursor, plan)

    def is_intact(self) -> bool:
        return (
            self._transaction.is_active
            and self.connection.in_transaction()
            and self._driver_in_transaction()
        )

    def commit(self) -> None:
        with self._store._translated("commit"):
            self._transaction.commit()

    def rollback(self) -> None:
        if self._transaction.is_active:
            with self._store._translated("rollback"):
                self._transaction.rollback()


def _check_replication_on_connect(engine: Engine, pg: bool) -> None:
    """``require_synchronous_replication=True``: every new connection checks that commits
    wait for a standby (docs/guarantees.md, "PostgreSQL failover"); a server where they do
    not is a ``ConfigurationError`` on first use, never a silent loss at a failover."""
    if not pg:
        raise ConfigurationError("require_synchronous_replication needs PostgreSQL")
    sa.event.listen(
        engine, "connect", lambda dbapi, _record: check_synchronous_replication(dbapi)
    )


class SQLPlumbing:
    """Everything of SQLStore but its primitives (see the package docstring)."""

    name: str
    #: The change feed (``_feed.py``), on PostgreSQL where ``LISTEN`` can work.
    _feed: ChangeFeed | None = None

    def __init__(
        self,
        url_or_engine: str | Engine,
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
        self._connect_timeout = float(connect_timeout)
        self._owns_engine = not isinstance(url_or_engine, Engine)
        self.prepare = bool(prepare)
        engine = _make_engine(
            url_or_engine, self._connect_timeout, pool_size, socket_timeout, prepare=self.prepare
        )
        self._engine = engine
        self.name = _dialect_name(engine)
        self._pg = self.name == "postgresql"
        if require_synchronous_replication:
            _check_replication_on_connect(engine, self._pg)
        self._mysql = self.name == "mysql"
        metadata = mysql_metadata if self._mysql else build_metadata
        self._metadata = metadata(table_prefix)
        self._fencing_table = fencing_table(table_prefix)
        self.table_prefix = table_prefix
        quote = engine.dialect.identifier_preparer.quote
        self._records = quote(f"{table_prefix}_records")
        dbapi = engine.dialect.loaded_dbapi
        self._errors: tuple[type[BaseException], ...] = (sa_exc.SQLAlchemyError, dbapi.Error)
        self._plans = dialect_plans(self.name, quote, table_prefix, dbapi.OperationalError)
        #: Checked whole on first use (``_dialects.check_schema``), then never again.
        self._unchecked: tuple[str, ...] = schema_objects(quote, table_prefix)
        self._common: q.Common = self._plans.common
        if self._mysql:
            adopt, restore = make_adopt(engine)
        else:
            adopt = self._adopt_pg if self._pg else self._sqlite_adopt
            restore = _pg_restore if self._pg else _sqlite_restore
        self._raw = _RawPool(engine, pool_size, adopt, restore)
        self._lost_types: tuple[type[BaseException], ...] = (
            (dbapi.OperationalError, dbapi.InterfaceError) if self._pg else ()
        )
        self._watchdog = _Watchdog(socket_timeout) if self._pg and socket_timeout else None
        self._start_feed(listen_url)

    def _start_feed(self, listen_url: str | None) -> None:
        """The change feed's two methods are set on the instance, never on the class: a
        store that cannot listen (SQLite, MySQL, PgBouncer without ``listen_url``) has no
        ``announce_change``/``wait_for_change`` at all, so ``hasattr`` and
        ``isinstance(store, ChangeFeedStore)`` tell it from one that can, and its waiters
        poll."""
        if not self._pg:
            if listen_url is not None:
                raise ConfigurationError("listen_url needs PostgreSQL")
            return
        self._feed = feed = sync_feed(
            self._engine, table_prefix=self.table_prefix, listen_url=listen_url,
            prepare=self.prepare, connect_timeout=self._connect_timeout,
            watchdog=self._watchdog,
        )
        if feed is not None:
            self._channel = feed.channel
            self.announce_change = self._announce_change
            self.wait_for_change = feed.wait

    def _announce_change(self, scope: Scope) -> None:
        """Wake ``scope``'s waiters in every process listening on this store's channel:
        one ``pg_notify`` (``_feed.py``)."""
        self._execute("announce_change", notify_plan(self._channel, scope))

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        return f"SQLStore({url!r}, table_prefix={self.table_prefix!r})"

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (also the one body transactions use)."""
        return self._engine

    # -- running statements -------------------------------------------------------------------
    def _failure(self, what: str, exc: BaseException) -> IdempotencyError:
        return translate(self.name, self.table_prefix, what, exc)

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise self._failure(what, exc) from exc

    def _execute(self, what: str, plan: Plan[_T]) -> _T:
        """Run a primitive's plan (``protocol.py``) on an idle autocommit connection (its
        cursor drives the plan); translate driver errors."""
        raw_pool = self._raw
        try:
            raw = raw_pool.acquire()
        except self._errors as exc:
            raise self._failure(what, exc) from exc
        watchdog = self._watchdog
        armed = watchdog.arm(raw.dbapi) if watchdog is not None else None
        try:
            if self._unchecked:
                drive(raw.cursor, check_schema(self._unchecked))
                self._unchecked = ()
            result = drive(raw.cursor, plan)
        except self._errors as exc:
            raw_pool.discard(raw, lost=self._is_lost(exc, raw))
            raise self._failure(what, exc) from exc
        except BaseException:
            raw_pool.discard(raw, lost=False)
            raise
        finally:
            intact = armed is None or watchdog is None or watchdog.disarm(armed)
        if intact:
            raw_pool.release(raw)
        else:  # answered just as the deadline broke the socket
            raw_pool.discard(raw, lost=False)
        return result

    def _is_lost(self, exc: BaseException, raw: _Raw) -> bool:
        if isinstance(exc, self._lost_types):
            return True
        try:
            return bool(self._engine.dialect.is_disconnect(exc, raw.dbapi, raw.cursor))  # type: ignore[arg-type]
        except Exception:
            return True

    def _adopt_pg(self, dbapi: Any, info: dict[Any, Any]) -> Any:
        if not self.prepare:  # an Engine passed in may not have it in its connect args
            dbapi.prepare_threshold = None
        return _pg_adopt(dbapi, info)

    def _sqlite_adopt(self, dbapi: Any, info: dict[Any, Any]) -> Any:
        """Per-connection SQLite settings: WAL, ``synchronous=NORMAL``, a busy timeout."""
        _sqlite_configure(dbapi, info, self._connect_timeout)
        saved = dbapi.isolation_level
        dbapi.isolation_level = None  # we issue BEGIN IMMEDIATE / COMMIT ourselves
        return saved

    # -- SQLAlchemy transactions --------------------------------------------------------------
    @contextlib.contextmanager
    def _sa_transaction(
        self, what: str, *, lock_schema: bool = False
    ) -> Iterator[tuple[Connection, RootTransaction, Callable[[], bool]]]:
        if self._raw.forked():
            self._raw.after_fork()
        with self._translated(what):
            conn = self._engine.connect()
        try:
            with self._translated(what):
                trans, in_txn = self._begin(conn, lock_schema)
        except BaseException:
            self._finish(conn, None)
            raise
        try:
            yield conn, trans, in_txn
        finally:
            self._finish(conn, trans)

    def _begin(
        self, conn: Connection, lock_schema: bool
    ) -> tuple[RootTransaction, Callable[[], bool]]:
        dbapi: Any = conn.connection.driver_connection
        if self._pg:
            if not self.prepare:
                dbapi.prepare_threshold = None
            trans = conn.begin()
            if lock_schema:  # serialise concurrent create_schema/drop_schema calls
                conn.exec_driver_sql(
                    "SELECT pg_advisory_xact_lock(hashtext(%(p)s))", {"p": self.table_prefix}
                )
                return trans, _always
            # psycopg opens the server transaction lazily, at the first statement; open it
            # now, so that a body that sends a raw COMMIT leaves the connection IDLE and is
            # caught by ``is_intact`` (one extra round trip on the transactional path).
            conn.exec_driver_sql("SELECT 1")
            return trans, lambda: dbapi.info.transaction_status != _PG_IDLE
        if self._mysql:  # create_schema serialises itself with GET_LOCK (DDL commits at once)
            return begin_body(conn)
        _sqlite_configure(dbapi, conn.connection.info, self._connect_timeout)
        conn.info["idempotent_tasks_isolation"] = dbapi.isolation_level
        dbapi.isolation_level = None
        trans = conn.begin()
        conn.exec_driver_sql(BEGIN)
        return trans, lambda: bool(dbapi.in_transaction)

    def _finish(self, conn: Connection, trans: RootTransaction | None) -> None:
        """Roll back what was not committed, restore the driver, return the connection."""
        try:
            if trans is not None and trans.is_active:
                trans.rollback()
            if not self._pg and "idempotent_tasks_isolation" in conn.info:
                _sqlite_restore(
                    conn.connection.driver_connection, conn.info.pop("idempotent_tasks_isolation")
                )
        except Exception:
            with contextlib.suppress(Exception):
                conn.invalidate()
        finally:
            with contextlib.suppress(Exception):
                conn.close()
