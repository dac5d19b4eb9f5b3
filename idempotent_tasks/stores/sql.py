"""SQL store: PostgreSQL (psycopg 3) and SQLite, one schema, one contract.

* Guarantee: every primitive of :class:`~idempotent_tasks.stores.base.Store` is atomic in the
  database, across threads, processes and hosts sharing it.  Records, retry counters and
  maintenance leases are rows in three tables; the retry counter row survives the deletion
  of its record.  Only this store supports ``execute_in_transaction`` (DESIGN §2b): the body's
  writes and the conditional ``mark_success`` commit in one transaction
  (:meth:`SQLStore.body_transaction`).
* Atomic primitive: the primary key ``(tenant, operation, key)`` with
  ``INSERT … ON CONFLICT``.  On PostgreSQL ``create`` is one statement (and one round trip)
  that inserts, replaces an expired record (resetting its counter) or returns the live
  one; ``create_many`` claims a whole batch in one statement; ``take_over`` and
  ``record_failure`` are single statements with data-modifying CTEs.  On SQLite a fresh
  claim is one autocommit ``INSERT … ON CONFLICT DO NOTHING RETURNING``; everything that reads
  before it writes runs under ``BEGIN IMMEDIATE`` (SQLite's single writer lock), so several
  OS processes and threads can share one database file.  Every write on an existing record is
  conditional on ``status = 'PROCESSING'`` and the fencing token.
* TTL: nothing expires by itself.  Timestamps are epoch seconds from the handler's clock,
  stored as ``DOUBLE PRECISION``; the database server's clock is never used.  ``create``
  treats a record with ``expires_at <= now`` as absent; ``delete_expired`` purges in batches
  (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so many workers can run it at once).
* Hot path: the claim/complete primitives run pre-built SQL on DBAPI connections kept in a
  small LIFO free list (autocommit; psycopg prepares repeated statements server-side),
  bypassing SQLAlchemy's execution layer; SQLAlchemy provides the engine and pool, the
  schema and the body transaction.
* Failures: every driver or pool error becomes
  :class:`~idempotent_tasks.StoreUnavailableError`.  A connection that failed is discarded;
  when it was lost (e.g. PostgreSQL restarted) every idle connection is discarded too, so
  the next call reconnects without manual steps.  On PostgreSQL every call has a deadline
  (``socket_timeout``, default 30 s): a call on a link that went silent has its connection
  broken by a watchdog thread and fails closed instead of hanging until TCP gives up.
* Connection string: ``postgresql+psycopg://user:pass@host:5432/db`` (``postgresql://`` means
  psycopg 3 too), ``sqlite:///path/to/idem.db``, or a SQLAlchemy ``Engine`` using psycopg or
  the stdlib sqlite3 driver.  The constructor never connects.

Schema (PostgreSQL flavour; ``create_schema()`` emits exactly this with the default prefix):

.. code-block:: sql

    CREATE TABLE idempotency_records (
        tenant TEXT COLLATE "C" NOT NULL,
        operation TEXT COLLATE "C" NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        status VARCHAR(16) NOT NULL,
        request_hash TEXT NOT NULL,
        response BYTEA,
        fencing_token BIGINT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        lease_expires_at DOUBLE PRECISION,
        expires_at DOUBLE PRECISION,
        CONSTRAINT idempotency_records_pkey PRIMARY KEY (tenant, operation, key),
        CONSTRAINT idempotency_records_status_ck
            CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED'))
    );
    CREATE INDEX idempotency_records_processing_idx
        ON idempotency_records (updated_at, tenant, operation, key) WHERE status = 'PROCESSING';
    CREATE INDEX idempotency_records_expires_idx ON idempotency_records (expires_at);

    CREATE TABLE idempotency_retry_counters (
        tenant TEXT COLLATE "C" NOT NULL,
        operation TEXT COLLATE "C" NOT NULL,
        key TEXT COLLATE "C" NOT NULL,
        count INTEGER NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        CONSTRAINT idempotency_retry_counters_pkey PRIMARY KEY (tenant, operation, key)
    );
    CREATE INDEX idempotency_retry_counters_updated_idx ON idempotency_retry_counters (updated_at);

    CREATE TABLE idempotency_locks (
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        CONSTRAINT idempotency_locks_pkey PRIMARY KEY (name)
    );
"""

from __future__ import annotations

import contextlib
import os
import re
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, RootTransaction

from .._errors import ConfigurationError, StoreUnavailableError
from .._records import CreateResult, Scope, Status, StoredRecord
from ._sql_connections import (
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
from ._sql_dialects import (
    _STATUS,
    _claim_params,
    _Common,
    _identity,
    _one,
    _Ops,
    _PostgresOps,
    _pyformat,
    _record,
    _scope_params,
    _scoped_record,
    _SQLiteOps,
)
from ._sql_schema import (
    DEFAULT_TABLE_PREFIX,
    _refuse_mismatch,
    build_metadata,
    create_missing_indexes,
)
from .base import BodyTransaction, ClaimRequest, FailureResult, SuccessWrite

__all__ = ["DEFAULT_TABLE_PREFIX", "POSTGRESQL_DDL", "SQLStore", "build_metadata"]

DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_POOL_SIZE: Final = 10
_PG_IDLE: Final = 0  # psycopg.pq.TransactionStatus.IDLE
#: Seconds a PostgreSQL call may wait for its answer before its connection is broken.
DEFAULT_SOCKET_TIMEOUT: Final = 30.0
#: How often ``create`` re-runs its statement when a concurrent insert was not yet visible.
_CREATE_ATTEMPTS: Final = 50
_PREFIX_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_PG_DRIVERS: Final = frozenset({"postgresql", "postgres", "postgresql+psycopg"})
_SQLITE_DRIVERS: Final = frozenset({"sqlite", "sqlite+pysqlite"})

#: The DDL ``create_schema()`` emits on PostgreSQL with the default prefix (for the README).
POSTGRESQL_DDL: Final = textwrap.dedent((__doc__ or "").split(".. code-block:: sql", 1)[1]).strip()

_T = TypeVar("_T")


# -- body transactions ------------------------------------------------------------------------
class _SQLBodyTransaction:
    """The §2b transaction: the body's writes and the conditional SUCCESS commit together."""

    def __init__(
        self,
        store: SQLStore,
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
        if not self.is_intact():
            raise ConfigurationError(
                "the body committed or rolled back the idempotency transaction itself",
                tenant=scope.tenant,
                operation=scope.operation,
                key=scope.key,
            )
        params = _scope_params(scope)
        params.update(token=token, response=response, now=now, expires_at=expires_at)
        with self._store._translated("mark_success"):
            result = self.connection.exec_driver_sql(self._store._common.mark_success, params)
            return int(result.rowcount) == 1

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


# -- the store --------------------------------------------------------------------------------
class SQLStore:
    """The durable store on PostgreSQL (psycopg 3) or SQLite; see the module docstring."""

    name: str

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_size: int = DEFAULT_POOL_SIZE,
        socket_timeout: float | None = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        if not isinstance(table_prefix, str) or not _PREFIX_RE.fullmatch(table_prefix):
            raise ConfigurationError(
                f"table_prefix {table_prefix!r} must be 1-40 characters of letters, digits and "
                "underscores, not starting with a digit"
            )
        if connect_timeout <= 0 or pool_size < 1:
            raise ConfigurationError("connect_timeout must be > 0 and pool_size >= 1")
        self._connect_timeout = float(connect_timeout)
        self._owns_engine = not isinstance(url_or_engine, Engine)
        engine = _make_engine(url_or_engine, self._connect_timeout, pool_size)
        self._engine = engine
        self.name = _dialect_name(engine)
        self._metadata = build_metadata(table_prefix)
        self.table_prefix = table_prefix
        quote = engine.dialect.identifier_preparer.quote
        r, c, lk = (quote(f"{table_prefix}_{t}") for t in ("records", "retry_counters", "locks"))
        dbapi = engine.dialect.loaded_dbapi
        self._errors: tuple[type[BaseException], ...] = (sa_exc.SQLAlchemyError, dbapi.Error)
        self._pg = self.name == "postgresql"
        convert = _pyformat if self._pg else _identity
        self._common = _Common(r, c, lk, convert)
        self._ops: _Ops = (_PostgresOps if self._pg else _SQLiteOps)(r, c, self._common)
        adopt = _pg_adopt if self._pg else self._sqlite_adopt
        restore = _pg_restore if self._pg else _sqlite_restore
        self._raw = _RawPool(engine, pool_size, adopt, restore)
        self._lost_types: tuple[type[BaseException], ...] = (
            (dbapi.OperationalError, dbapi.InterfaceError) if self._pg else ()
        )
        if socket_timeout is not None and socket_timeout <= 0:
            raise ConfigurationError("socket_timeout must be > 0 (or None)")
        self._watchdog = _Watchdog(socket_timeout) if self._pg and socket_timeout else None

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        return f"SQLStore({url!r}, table_prefix={self.table_prefix!r})"

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (also the one body transactions use)."""
        return self._engine

    # -- plumbing ---------------------------------------------------------------------------
    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"{self.name} store: {what} failed: {type(exc).__name__}: {exc}".strip()
        )

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise self._unavailable(what, exc) from exc

    def _run(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """Run ``fn(cursor)`` on an idle autocommit connection; translate driver errors."""
        raw_pool = self._raw
        try:
            raw = raw_pool.acquire()
        except self._errors as exc:
            raise self._unavailable(what, exc) from exc
        watchdog = self._watchdog
        armed = watchdog.arm(raw.dbapi) if watchdog is not None else None
        try:
            result = fn(raw.cursor)
        except self._errors as exc:
            raw_pool.discard(raw, lost=self._is_lost(exc, raw))
            raise self._unavailable(what, exc) from exc
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

    def _sqlite_adopt(self, dbapi: Any, info: dict[Any, Any]) -> Any:
        """Per-connection SQLite settings: WAL, ``synchronous=NORMAL``, a busy timeout."""
        _sqlite_configure(dbapi, info, self._connect_timeout)
        saved = dbapi.isolation_level
        dbapi.isolation_level = None  # we issue BEGIN IMMEDIATE / COMMIT ourselves
        return saved

    # -- claims -----------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, token: int, now: float, lease_expires_at: float
    ) -> CreateResult:
        params = _claim_params(scope, request_hash, token, now, lease_expires_at)
        return self._run("create", lambda cur: self._create(cur, scope, params))

    def _create(self, cur: Any, scope: Scope, params: Mapping[str, Any]) -> CreateResult:
        for _ in range(_CREATE_ATTEMPTS):
            result = self._ops.create(cur, scope, params)
            if result is not None:
                return result
        raise StoreUnavailableError(f"{self.name} store: create kept racing concurrent writers")

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        if not claims:
            return []

        def run(cur: Any) -> list[CreateResult]:
            results = self._ops.create_many(cur, claims, now, lease_expires_at)
            return [
                r
                if r is not None
                else self._create(
                    cur,
                    c.scope,
                    _claim_params(c.scope, c.request_hash, c.token, now, lease_expires_at),
                )
                for c, r in zip(claims, results, strict=True)
            ]

        return self._run("create_many", run)

    def get(self, scope: Scope) -> StoredRecord | None:
        row = self._run("get", lambda cur: _one(cur, self._common.get, _scope_params(scope)))
        return None if row is None else _record(scope, row)

    # -- conditional writes -----------------------------------------------------------------
    def _rowcount(self, what: str, sql: str, params: Mapping[str, Any]) -> int:
        def run(cur: Any) -> int:
            cur.execute(sql, params)
            return int(cur.rowcount)

        return self._run(what, run)

    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        new_token: int,
        now: float,
        lease_expires_at: float,
    ) -> int | None:
        p = _scope_params(scope)
        p.update(token=expected_token, new_token=new_token, now=now, lease=lease_expires_at)
        return self._run("take_over", lambda cur: self._ops.take_over(cur, p))

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        p = _scope_params(scope)
        p.update(token=token, now=now, lease=lease_expires_at)
        return self._rowcount("heartbeat", self._common.heartbeat, p) == 1

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        p = _scope_params(scope)
        p.update(token=token, response=response, now=now, expires_at=expires_at)
        return self._rowcount("mark_success", self._common.mark_success, p) == 1

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        if not writes:
            return []
        return self._run(
            "mark_success_many", lambda cur: self._ops.mark_success_many(cur, writes, now)
        )

    def mark_failed(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> bool:
        p = _scope_params(scope)
        p.update(token=token, now=now, expires_at=expires_at)
        common = self._common
        sql = common.mark_failed_expired if only_if_lease_expired else common.mark_failed
        return self._rowcount("mark_failed", sql, p) == 1

    def release(self, scope: Scope, *, token: int) -> bool:
        p = _scope_params(scope)
        p["token"] = token
        return self._rowcount("release", self._common.release, p) == 1

    def record_failure(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        max_retries: int,
        expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None:
        p = _scope_params(scope)
        p.update(token=token, now=now, max_retries=max_retries, expires_at=expires_at)
        return self._run(
            "record_failure", lambda cur: self._ops.record_failure(cur, p, only_if_lease_expired)
        )

    # -- counters and operator actions ------------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        sql = self._common.get_count
        row = self._run("get_retry_count", lambda cur: _one(cur, sql, _scope_params(scope)))
        return 0 if row is None else int(row[0])

    def reset_retry_count(self, scope: Scope) -> None:
        self._rowcount("reset_retry_count", self._common.reset_count, _scope_params(scope))

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        p = _scope_params(scope)
        sql = self._common.delete_record
        if status is not None:
            p["status"] = Status(status).value
            sql = self._common.delete_record_status
        row = self._run("delete_record", lambda cur: _one(cur, sql, p))
        return None if row is None else _record(scope, row)

    # -- maintenance ------------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        p: dict[str, Any] = {"now": now, "limit": limit, "heartbeat_before": heartbeat_before}
        sql = self._common.find_stuck if heartbeat_before is None else self._common.find_stuck_hb
        rows = self._run("find_stuck", lambda cur: cur.execute(sql, p).fetchall())
        return [_scoped_record(row) for row in rows]

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        p = {"now": now, "before": counters_before, "limit": limit}
        return self._run("delete_expired", lambda cur: self._ops.delete_expired(cur, p))

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        filters = {
            "status": None if status is None else Status(status).value,
            "operation": operation,
            "tenant": tenant,
        }
        used = {k: v for k, v in filters.items() if v is not None}
        where = " AND ".join(f"{k} = :{k}" for k in used)
        sql = self._common.list_head + (f" WHERE {where}" if where else "")
        sql = self._common.convert(sql + self._common.list_tail)
        p = {**used, "limit": limit, "offset": offset}
        rows = self._run("list_records", lambda cur: cur.execute(sql, p).fetchall())
        return [_scoped_record(row) for row in rows]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        sql = self._common.stats
        rows = self._run("stats", lambda cur: cur.execute(sql).fetchall())
        return {(op, _STATUS[status]): int(n) for op, status, n in rows}

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        p = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
        sql = self._common.acquire_lock
        return self._run("acquire_lock", lambda cur: _one(cur, sql, p)) is not None

    def release_lock(self, name: str, *, owner: str) -> None:
        self._rowcount("release_lock", self._common.release_lock, {"name": name, "owner": owner})

    # -- schema -----------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create the tables and indexes if missing (idempotent, safe to run concurrently).

        Raises :class:`ConfigurationError` when a table of the same name exists with other
        columns: the store would otherwise fail on every call, or worse, half-work.
        """
        with (
            self._sa_transaction("create_schema", lock_schema=True) as (conn, trans, _in),
            self._translated("create_schema"),
        ):
            inspector = sa.inspect(conn)
            for table in self._metadata.sorted_tables:
                if inspector.has_table(table.name):
                    _refuse_mismatch(table, inspector)
            self._metadata.create_all(conn, checkfirst=True)
            create_missing_indexes(conn, self._metadata)
            trans.commit()

    def drop_schema(self) -> None:
        """Drop the store's tables (tests, ``demo`` clean-up); idempotent."""
        self._raw.drain(invalidate=False)
        with (
            self._sa_transaction("drop_schema", lock_schema=True) as (conn, trans, _in),
            self._translated("drop_schema"),
        ):
            self._metadata.drop_all(conn, checkfirst=True)
            trans.commit()

    def close(self) -> None:
        """Return idle connections; dispose of the engine when the store created it."""
        self._raw.drain(invalidate=False)
        if self._owns_engine:
            self._engine.dispose()

    # -- §2b ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def body_transaction(self) -> Iterator[BodyTransaction]:
        """A connection with a transaction begun (on SQLite holding the write lock from the
        start); rolled back unless committed; the connection always goes back to the pool."""
        with self._sa_transaction("body_transaction") as (conn, trans, in_txn):
            yield _SQLBodyTransaction(self, conn, trans, in_txn)

    @contextlib.contextmanager
    def _sa_transaction(
        self, what: str, *, lock_schema: bool = False
    ) -> Iterator[tuple[Connection, RootTransaction, Callable[[], bool]]]:
        if self._raw._pid != os.getpid():
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
        _sqlite_configure(dbapi, conn.connection.info, self._connect_timeout)
        conn.info["idempotent_tasks_isolation"] = dbapi.isolation_level
        dbapi.isolation_level = None
        trans = conn.begin()
        conn.exec_driver_sql("BEGIN IMMEDIATE")
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


