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
    CREATE INDEX idempotency_records_stuck_idx ON idempotency_records (status, lease_expires_at);
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
import itertools
import math
import os
import re
import socket
import textwrap
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, RootTransaction

from .._errors import ConfigurationError, StoreUnavailableError
from .._records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from .base import BodyTransaction, ClaimRequest, FailureResult

__all__ = ["DEFAULT_TABLE_PREFIX", "POSTGRESQL_DDL", "SQLStore", "build_metadata"]

DEFAULT_TABLE_PREFIX: Final = "idempotency"
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

_STATUS: Final[Mapping[str, Status]] = {s.value: s for s in Status}
_T = TypeVar("_T")


# -- schema -----------------------------------------------------------------------------------
def _scope_text() -> sa.types.TypeEngine[str]:
    # "C" collation on PostgreSQL: byte order (= code point order, like the memory store) and
    # cheaper comparisons; equality is the same under every deterministic collation.
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def build_metadata(prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The three tables (records, retry counters, maintenance locks) as SQLAlchemy Core."""
    md = sa.MetaData()
    sa.Table(
        f"{prefix}_records",
        md,
        sa.Column("tenant", _scope_text(), primary_key=True),
        sa.Column("operation", _scope_text(), primary_key=True),
        sa.Column("key", _scope_text(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("lease_expires_at", sa.Double(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("tenant", "operation", "key", name=f"{prefix}_records_pkey"),
        sa.CheckConstraint(
            "status IN ('PROCESSING', 'SUCCESS', 'FAILED')", name=f"{prefix}_records_status_ck"
        ),
        sa.Index(f"{prefix}_records_stuck_idx", "status", "lease_expires_at"),
        sa.Index(f"{prefix}_records_expires_idx", "expires_at"),
    )
    sa.Table(
        f"{prefix}_retry_counters",
        md,
        sa.Column("tenant", _scope_text(), primary_key=True),
        sa.Column("operation", _scope_text(), primary_key=True),
        sa.Column("key", _scope_text(), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "operation", "key", name=f"{prefix}_retry_counters_pkey"),
        sa.Index(f"{prefix}_retry_counters_updated_idx", "updated_at"),
    )
    sa.Table(
        f"{prefix}_locks",
        md,
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=f"{prefix}_locks_pkey"),
    )
    return md


def _refuse_mismatch(table: sa.Table, inspector: sa.Inspector) -> None:
    problems = _column_mismatches(table, inspector)
    if problems:
        raise ConfigurationError(
            f"table {table.name!r} exists but does not match the idempotent_tasks schema: "
            f"{'; '.join(problems)}. Use another table_prefix, or migrate or drop that table."
        )


def _type_family(type_: Any) -> str:
    """Coarse type class for comparing a reflected column with the expected one."""
    if isinstance(type_, sa.LargeBinary):
        return "binary"
    if isinstance(type_, sa.Integer):
        return "integer"
    if isinstance(type_, sa.Float | sa.Numeric):
        return "float"
    if isinstance(type_, sa.String):
        return "text"
    return type(type_).__name__.lower()


def _column_mismatches(table: sa.Table, inspector: sa.Inspector) -> list[str]:
    """Human-readable differences between ``table`` and the same-named table in the database."""
    found = {c["name"]: _type_family(c["type"]) for c in inspector.get_columns(table.name)}
    wanted = {c.name: _type_family(c.type) for c in table.columns}
    problems = [f"missing column {n!r}" for n in wanted if n not in found]
    problems += [f"unexpected column {n!r}" for n in found if n not in wanted]
    problems += [
        f"column {n!r} is {found[n]}, expected {family}"
        for n, family in wanted.items()
        if n in found and found[n] != family
    ]
    pk = inspector.get_pk_constraint(table.name).get("constrained_columns") or []
    expected_pk = [c.name for c in table.primary_key.columns]
    if not problems and sorted(pk) != sorted(expected_pk):
        problems.append(f"primary key is {pk}, expected {expected_pk}")
    return problems


# -- SQL text ---------------------------------------------------------------------------------
_SCOPE: Final = "tenant = :tenant AND operation = :operation AND key = :key"
_OWNED: Final = _SCOPE + " AND status = 'PROCESSING' AND fencing_token = :token"
_LEASE_EXPIRED: Final = " AND (lease_expires_at IS NULL OR lease_expires_at <= :now)"
_RECORD_COLS: Final = (
    "status, request_hash, response, fencing_token, created_at, updated_at, "
    "lease_expires_at, expires_at"
)
_INSERT_COLS: Final = (
    "(tenant, operation, key, status, request_hash, response, fencing_token, created_at, "
    "updated_at, lease_expires_at, expires_at)"
)
_NEW_VALUES: Final = (
    "(:tenant, :operation, :key, 'PROCESSING', :request_hash, NULL, :token, :now, :now, "
    ":lease, NULL)"
)
_REPLACE_SET: Final = (
    "status = 'PROCESSING', request_hash = excluded.request_hash, response = NULL, "
    "fencing_token = excluded.fencing_token, created_at = excluded.created_at, "
    "updated_at = excluded.updated_at, lease_expires_at = excluded.lease_expires_at, "
    "expires_at = NULL"
)
_PARAM_RE: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _pyformat(sql: str) -> str:
    """``:name`` placeholders → psycopg's ``%(name)s`` (casts like ``::bigint`` are kept)."""
    return _PARAM_RE.sub(r"%(\1)s", sql)


class _Common:
    """Statements both dialects run verbatim (single conditional statements)."""

    def __init__(self, records: str, counters: str, locks: str, convert: Callable[[str], str]):
        r, c, lk = records, counters, locks
        self.get = convert(f"SELECT {_RECORD_COLS} FROM {r} WHERE {_SCOPE}")
        self.heartbeat = convert(
            f"UPDATE {r} SET lease_expires_at = :lease, updated_at = :now WHERE {_OWNED}"
        )
        self.mark_success = convert(
            f"UPDATE {r} SET status = 'SUCCESS', response = :response, updated_at = :now, "
            f"lease_expires_at = NULL, expires_at = :expires_at WHERE {_OWNED}"
        )
        poison = (
            f"UPDATE {r} SET status = 'FAILED', updated_at = :now, lease_expires_at = NULL, "
            f"expires_at = :expires_at WHERE {_OWNED}"
        )
        self.mark_failed = convert(poison)
        self.mark_failed_expired = convert(poison + _LEASE_EXPIRED)
        self.release = convert(f"DELETE FROM {r} WHERE {_OWNED}")
        self.bump = convert(
            f"INSERT INTO {c} AS c (tenant, operation, key, count, updated_at) "
            "VALUES (:tenant, :operation, :key, 1, :now) "
            "ON CONFLICT (tenant, operation, key) DO UPDATE "
            "SET count = c.count + 1, updated_at = excluded.updated_at RETURNING count"
        )
        self.get_count = convert(f"SELECT count FROM {c} WHERE {_SCOPE}")
        self.reset_count = convert(f"DELETE FROM {c} WHERE {_SCOPE}")
        delete = f"DELETE FROM {r} WHERE {_SCOPE}"
        self.delete_record = convert(f"{delete} RETURNING {_RECORD_COLS}")
        self.delete_record_status = convert(
            f"{delete} AND status = :status RETURNING {_RECORD_COLS}"
        )
        stuck = (
            f"SELECT tenant, operation, key, {_RECORD_COLS} FROM {r} "
            "WHERE status = 'PROCESSING' AND lease_expires_at <= :now"
        )
        order = " ORDER BY updated_at, tenant, operation, key LIMIT :limit"
        self.find_stuck = convert(stuck + order)
        self.find_stuck_hb = convert(stuck + " AND updated_at < :heartbeat_before" + order)
        self.list_head = f"SELECT tenant, operation, key, {_RECORD_COLS} FROM {r}"
        self.list_tail = " ORDER BY created_at, tenant, operation, key LIMIT :limit OFFSET :offset"
        self.stats = f"SELECT operation, status, count(*) FROM {r} GROUP BY operation, status"
        self.acquire_lock = convert(
            f"INSERT INTO {lk} AS l (name, owner, expires_at) VALUES (:name, :owner, :expires_at) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
            "expires_at = excluded.expires_at "
            "WHERE l.owner = excluded.owner OR l.expires_at <= :now RETURNING 1"
        )
        self.release_lock = convert(f"DELETE FROM {lk} WHERE name = :name AND owner = :owner")
        self.convert = convert


# -- helpers ----------------------------------------------------------------------------------
def _scope_params(scope: Scope) -> dict[str, Any]:
    return {"tenant": scope.tenant, "operation": scope.operation, "key": scope.key}


def _record(scope: Scope, row: Sequence[Any]) -> StoredRecord:
    """A StoredRecord from the eight ``_RECORD_COLS`` values."""
    response = row[2]
    return StoredRecord(
        scope=scope,
        status=_STATUS[row[0]],
        request_hash=row[1],
        response=None if response is None else bytes(response),
        fencing_token=int(row[3]),
        created_at=float(row[4]),
        updated_at=float(row[5]),
        lease_expires_at=None if row[6] is None else float(row[6]),
        expires_at=None if row[7] is None else float(row[7]),
    )


def _scoped_record(row: Sequence[Any]) -> StoredRecord:
    return _record(Scope(row[0], row[1], row[2]), row[3:])


def _new_record(
    scope: Scope, request_hash: str, token: int, now: float, lease: float
) -> StoredRecord:
    return StoredRecord(
        scope=scope,
        status=Status.PROCESSING,
        request_hash=request_hash,
        response=None,
        fencing_token=token,
        created_at=now,
        updated_at=now,
        lease_expires_at=lease,
        expires_at=None,
    )


def _one(cursor: Any, sql: str, params: Mapping[str, Any]) -> Any:
    """First row or None; always drains the result (SQLite ends the statement only then)."""
    cursor.execute(sql, params)
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _created(scope: Scope, p: Mapping[str, Any]) -> CreateResult:
    record = _new_record(scope, p["request_hash"], p["token"], p["now"], p["lease"])
    return CreateResult(CreateOutcome.CREATED, record)


def _claim_params(
    scope: Scope, request_hash: str, token: int, now: float, lease: float
) -> dict[str, Any]:
    p = _scope_params(scope)
    p.update(request_hash=request_hash, token=token, now=now, lease=lease)
    return p


def _live_duplicate(scope: Scope, row: Sequence[Any], now: float) -> CreateResult | None:
    """The DUPLICATE a PostgreSQL claim read, or None when the read cannot be trusted.

    The conflict check sees the latest row version, the read beside it only the statement's
    snapshot.  When a concurrent transaction inserted the row, or replaced an expired one,
    after that snapshot, the read finds no row or the old expired version; the statement
    must then run again (a live record never looks expired at ``now``: it would have been
    replaced).
    """
    if row[0] is None:
        return None
    record = _record(scope, row)
    if record.expires_at is not None and record.expires_at <= now:
        return None
    return CreateResult(CreateOutcome.DUPLICATE, record)


# -- dialects ---------------------------------------------------------------------------------
class _PostgresOps:
    """PostgreSQL: every primitive is one statement (CTEs for the multi-row ones)."""

    begin = "BEGIN"

    def __init__(self, r: str, c: str, common: _Common) -> None:
        self._c = common
        ins = (
            f"INSERT INTO {r} AS r {_INSERT_COLS} VALUES {_NEW_VALUES} "
            f"ON CONFLICT (tenant, operation, key) DO UPDATE SET {_REPLACE_SET} "
            "WHERE r.expires_at IS NOT NULL AND r.expires_at <= :now "
            "RETURNING (r.xmax = 0) AS inserted"
        )
        # One round trip: insert, or replace an expired record (and reset its counter), or
        # read the live one.  Zero rows means the conflicting row is newer than this
        # statement's snapshot: the caller runs it again.
        self._create_sql = _pyformat(
            f"WITH ins AS ({ins}), "
            f"reset AS (DELETE FROM {c} WHERE {_SCOPE} "
            "AND EXISTS (SELECT 1 FROM ins WHERE NOT inserted)) "
            "SELECT true, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::float8, "
            "NULL::float8, NULL::float8, NULL::float8 FROM ins "
            f"UNION ALL SELECT false, {_RECORD_COLS} FROM {r} "
            f"WHERE {_SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
        )
        self._create_many_sql = _pyformat(
            "WITH input AS (SELECT * FROM unnest(:tenants::text[], :operations::text[], "
            ":keys::text[], :hashes::text[], :tokens::bigint[]) WITH ORDINALITY "
            "AS i(tenant, operation, key, request_hash, fencing_token, ord)), "
            f"ins AS (INSERT INTO {r} AS r {_INSERT_COLS} "
            "SELECT tenant, operation, key, 'PROCESSING', request_hash, NULL, fencing_token, "
            ":now, :now, :lease, NULL FROM input ORDER BY tenant, operation, key "
            f"ON CONFLICT (tenant, operation, key) DO UPDATE SET {_REPLACE_SET} "
            "WHERE r.expires_at IS NOT NULL AND r.expires_at <= :now "
            "RETURNING r.tenant, r.operation, r.key, (r.xmax = 0) AS inserted), "
            f"reset AS (DELETE FROM {c} AS c USING ins WHERE NOT ins.inserted "
            "AND c.tenant = ins.tenant AND c.operation = ins.operation AND c.key = ins.key) "
            "SELECT i.ord, ins.tenant IS NOT NULL, "
            + ", ".join(f"r.{col}" for col in _RECORD_COLS.split(", "))
            + " FROM input i LEFT JOIN ins ON ins.tenant = i.tenant "
            "AND ins.operation = i.operation AND ins.key = i.key "
            f"LEFT JOIN {r} r ON ins.tenant IS NULL AND r.tenant = i.tenant "
            "AND r.operation = i.operation AND r.key = i.key ORDER BY i.ord"
        )
        bump = (
            f"INSERT INTO {c} AS c (tenant, operation, key, count, updated_at) "
            "SELECT :tenant, :operation, :key, 1, :now FROM {src} "
            "ON CONFLICT (tenant, operation, key) DO UPDATE "
            "SET count = c.count + 1, updated_at = excluded.updated_at RETURNING c.count"
        )
        self._take_over_sql = _pyformat(
            f"WITH upd AS (UPDATE {r} SET fencing_token = :new_token, "
            "lease_expires_at = :lease, updated_at = :now "
            f"WHERE {_OWNED}{_LEASE_EXPIRED} RETURNING 1), "
            f"bump AS ({bump.format(src='upd')}) SELECT count FROM bump"
        )
        failure = (
            f"WITH target AS (SELECT 1 FROM {r} WHERE {_OWNED}{{cond}} FOR UPDATE), "
            f"bump AS ({bump.format(src='target')}), "
            f"poison AS (UPDATE {r} SET status = 'FAILED', updated_at = :now, "
            f"lease_expires_at = NULL, expires_at = :expires_at WHERE {_OWNED} "
            "AND EXISTS (SELECT 1 FROM bump WHERE count >= :max_retries) RETURNING 1), "
            f"released AS (DELETE FROM {r} WHERE {_OWNED} "
            "AND EXISTS (SELECT 1 FROM bump WHERE count < :max_retries) RETURNING 1) "
            "SELECT count FROM bump"
        )
        self._record_failure_sql = _pyformat(failure.format(cond=""))
        self._record_failure_expired_sql = _pyformat(failure.format(cond=_LEASE_EXPIRED))
        self._delete_records_sql = _pyformat(
            f"WITH doomed AS (SELECT tenant, operation, key FROM {r} "
            "WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED) "
            f"DELETE FROM {r} AS r USING doomed WHERE r.tenant = doomed.tenant "
            "AND r.operation = doomed.operation AND r.key = doomed.key"
        )
        self._delete_counters_sql = _pyformat(
            f"DELETE FROM {c} WHERE (tenant, operation, key) IN ("
            f"SELECT tenant, operation, key FROM {c} AS cc WHERE cc.updated_at < :before "
            f"AND NOT EXISTS (SELECT 1 FROM {r} AS r WHERE r.tenant = cc.tenant "
            "AND r.operation = cc.operation AND r.key = cc.key) FOR UPDATE SKIP LOCKED)"
        )

    def create(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        row = _one(cur, self._create_sql, p)
        if row is None:
            return None  # raced with an insert newer than our snapshot: run it again
        if row[0]:
            return _created(scope, p)
        return _live_duplicate(scope, row[1:], p["now"])

    def create_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> list[CreateResult | None]:
        params = {
            "tenants": [c.scope.tenant for c in claims],
            "operations": [c.scope.operation for c in claims],
            "keys": [c.scope.key for c in claims],
            "hashes": [c.request_hash for c in claims],
            "tokens": [c.token for c in claims],
            "now": now,
            "lease": lease,
        }
        cur.execute(self._create_many_sql, params)
        results: list[CreateResult | None] = []
        for claim, row in zip(claims, cur.fetchall(), strict=True):
            if row[1]:
                record = _new_record(claim.scope, claim.request_hash, claim.token, now, lease)
                results.append(CreateResult(CreateOutcome.CREATED, record))
            else:
                results.append(_live_duplicate(claim.scope, row[2:], now))
        return results

    def take_over(self, cur: Any, p: Mapping[str, Any]) -> int | None:
        row = _one(cur, self._take_over_sql, p)
        return None if row is None else int(row[0])

    def record_failure(
        self, cur: Any, p: Mapping[str, Any], only_if_lease_expired: bool
    ) -> FailureResult | None:
        sql = (
            self._record_failure_expired_sql if only_if_lease_expired else self._record_failure_sql
        )
        row = _one(cur, sql, p)
        if row is None:
            return None
        count = int(row[0])
        return FailureResult(count, poisoned=count >= p["max_retries"])

    def delete_expired(self, cur: Any, p: Mapping[str, Any]) -> int:
        cur.execute(self._delete_records_sql, p)
        purged = int(cur.rowcount)
        cur.execute(self._delete_counters_sql, p)
        return purged


class _SQLiteOps:
    """SQLite: one autocommit statement where possible, else ``BEGIN IMMEDIATE``."""

    begin = "BEGIN IMMEDIATE"

    def __init__(self, r: str, c: str, common: _Common) -> None:
        self._c = common
        self._insert_new_sql = (
            f"INSERT INTO {r} {_INSERT_COLS} VALUES {_NEW_VALUES} "
            "ON CONFLICT (tenant, operation, key) DO NOTHING RETURNING 1"
        )
        self._replace_sql = (
            f"INSERT INTO {r} AS r {_INSERT_COLS} VALUES {_NEW_VALUES} "
            f"ON CONFLICT (tenant, operation, key) DO UPDATE SET {_REPLACE_SET}"
        )
        self._take_over_sql = (
            f"UPDATE {r} SET fencing_token = :new_token, lease_expires_at = :lease, "
            f"updated_at = :now WHERE {_OWNED}{_LEASE_EXPIRED}"
        )
        self._owned_sql = f"SELECT 1 FROM {r} WHERE {_OWNED}"
        self._delete_records_sql = (
            f"DELETE FROM {r} WHERE rowid IN (SELECT rowid FROM {r} "
            "WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit)"
        )
        self._delete_counters_sql = (
            f"DELETE FROM {c} WHERE updated_at < :before AND NOT EXISTS (SELECT 1 FROM {r} AS r "
            f"WHERE r.tenant = {c}.tenant AND r.operation = {c}.operation AND r.key = {c}.key)"
        )

    def create(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        if _one(cur, self._insert_new_sql, p) is not None:
            return _created(scope, p)  # the common first delivery: one statement
        cur.execute(self.begin)
        result = self._claim_locked(cur, scope, p)
        cur.execute("COMMIT")
        return result

    def _claim_locked(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult:
        """Claim under the write lock: read, then insert or replace an expired record."""
        row = _one(cur, self._c.get, p)
        if row is not None and (row[7] is None or row[7] > p["now"]):
            return CreateResult(CreateOutcome.DUPLICATE, _record(scope, row))
        if row is not None:
            cur.execute(self._c.reset_count, p)  # re-created after expiry: a fresh counter
        cur.execute(self._replace_sql, p)
        return _created(scope, p)

    def create_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> list[CreateResult | None]:
        cur.execute(self.begin)
        results: list[CreateResult | None] = [
            self._claim_locked(
                cur, c.scope, _claim_params(c.scope, c.request_hash, c.token, now, lease)
            )
            for c in claims
        ]
        cur.execute("COMMIT")
        return results

    def take_over(self, cur: Any, p: Mapping[str, Any]) -> int | None:
        cur.execute(self.begin)
        cur.execute(self._take_over_sql, p)
        count = int(_one(cur, self._c.bump, p)[0]) if cur.rowcount == 1 else None
        cur.execute("COMMIT")
        return count

    def record_failure(
        self, cur: Any, p: Mapping[str, Any], only_if_lease_expired: bool
    ) -> FailureResult | None:
        cur.execute(self.begin)
        owned = self._owned_sql + (_LEASE_EXPIRED if only_if_lease_expired else "")
        result = None
        if _one(cur, owned, p) is not None:
            count = int(_one(cur, self._c.bump, p)[0])
            poisoned = count >= p["max_retries"]
            cur.execute(self._c.mark_failed if poisoned else self._c.release, p)
            result = FailureResult(count, poisoned=poisoned)
        cur.execute("COMMIT")
        return result

    def delete_expired(self, cur: Any, p: Mapping[str, Any]) -> int:
        cur.execute(self._delete_records_sql, p)
        purged = int(cur.rowcount)
        cur.execute(self._delete_counters_sql, p)
        return purged


_Ops = _PostgresOps | _SQLiteOps


# -- raw connections --------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class _Raw:
    """A DBAPI connection checked out of the engine's pool and kept in our free list."""

    fairy: Any  # sqlalchemy PoolProxiedConnection
    dbapi: Any
    cursor: Any
    saved: Any  # the driver setting we changed (autocommit / isolation_level), restored on return


class _RawPool:
    """A LIFO free list of autocommit DBAPI connections over the engine's pool.

    Checking a connection out of SQLAlchemy's pool and resetting it on return costs more than
    the statements themselves on the hot path, so connections stay checked out while idle
    here (at most ``size``).  A connection that failed is invalidated; a lost connection
    drains the whole list and the engine pool's idle connections, since they died with it.
    """

    def __init__(
        self,
        engine: Engine,
        size: int,
        adopt: Callable[[Any, dict[Any, Any]], Any],
        restore: Callable[[Any, Any], None],
    ) -> None:
        self._engine = engine
        self._size = size
        self._adopt = adopt
        self._restore = restore
        self._idle: deque[_Raw] = deque()
        self._pid = os.getpid()
        self._orphans: list[_Raw] = []

    def acquire(self) -> _Raw:
        if self._pid != os.getpid():
            self.after_fork()
        try:
            return self._idle.pop()
        except IndexError:
            return self._open()

    def _open(self) -> _Raw:
        fairy = self._engine.raw_connection()
        try:
            dbapi: Any = fairy.driver_connection
            saved = self._adopt(dbapi, fairy.info)
            return _Raw(fairy, dbapi, dbapi.cursor(), saved)
        except BaseException:
            fairy.invalidate()
            raise

    def release(self, raw: _Raw) -> None:
        if len(self._idle) < self._size:
            self._idle.append(raw)
        else:
            self._give_back(raw)

    def _give_back(self, raw: _Raw) -> None:
        try:
            self._restore(raw.dbapi, raw.saved)
            raw.fairy.close()
        except Exception:
            raw.fairy.invalidate()

    def discard(self, raw: _Raw, *, lost: bool) -> None:
        """Drop a connection whose state is unknown after an error."""
        with contextlib.suppress(Exception):
            raw.fairy.invalidate()
        if lost:
            self.drain(invalidate=True)
            with contextlib.suppress(Exception):
                self._engine.pool.dispose()  # idle pooled connections died with this one

    def drain(self, *, invalidate: bool = False) -> None:
        while True:
            try:
                raw = self._idle.pop()
            except IndexError:
                return
            if invalidate:
                with contextlib.suppress(Exception):
                    raw.fairy.invalidate()
            else:
                self._give_back(raw)

    def after_fork(self) -> None:
        """In a forked child: never touch the parent's sockets/handles, start afresh."""
        self._orphans.extend(self._idle)  # keep them referenced: no finaliser may close them
        self._idle = deque()
        self._pid = os.getpid()
        self._engine.dispose(close=False)


def _pg_adopt(dbapi: Any, info: dict[Any, Any]) -> Any:
    saved = dbapi.autocommit
    dbapi.autocommit = True
    return saved


def _pg_restore(dbapi: Any, saved: Any) -> None:
    dbapi.autocommit = saved


def _sqlite_restore(dbapi: Any, saved: Any) -> None:
    if dbapi.in_transaction:
        dbapi.rollback()
    dbapi.isolation_level = saved


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


# -- a deadline for every statement -----------------------------------------------------------
class _Watchdog:
    """Breaks a PostgreSQL connection whose call outlived ``timeout`` seconds.

    psycopg has no client-side read timeout for an established connection: on a link that
    goes silent (a partition, a stuck proxy) a call would block until the kernel gives up,
    minutes later.  One daemon thread watches the calls in flight; when one passes its
    deadline it shuts the socket down, the blocked call fails, and the store translates that
    into ``STORE_UNAVAILABLE`` and discards the connection.  Arming costs a dict write.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._armed: dict[int, tuple[float, Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, dbapi: Any) -> int:
        ident = next(self._ids)
        self._armed[ident] = (time.monotonic() + self.timeout, dbapi)
        if self._thread is None:
            self._start()
        return ident

    def disarm(self, ident: int) -> bool:
        """False when the deadline already fired: the connection is broken, drop it."""
        return self._armed.pop(ident, None) is not None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="idempotent-tasks-sql-watchdog", daemon=True
                )
                self._thread.start()

    def _watch(self) -> None:
        tick = min(0.25, self.timeout / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            for ident, (deadline, dbapi) in list(self._armed.items()):
                if deadline <= now and self._armed.pop(ident, None) is not None:
                    _break_connection(dbapi)


def _break_connection(dbapi: Any) -> None:
    """Shut the socket down under a blocked psycopg call (it then fails at once)."""
    with contextlib.suppress(Exception):
        fd = dbapi.pgconn.socket
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


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


# -- construction -----------------------------------------------------------------------------
def _identity(sql: str) -> str:
    return sql


def _always() -> bool:
    return True


def _sqlite_configure(dbapi: Any, info: dict[Any, Any], timeout: float) -> None:
    """WAL lets readers run beside the one writer; NORMAL sync is durable across process
    crashes (WAL); the busy timeout makes lock waits block, not fail, up to ``timeout``."""
    if info.get("idempotent_tasks_sqlite"):
        return
    dbapi.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    mode = dbapi.execute("PRAGMA journal_mode").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        dbapi.execute("PRAGMA journal_mode = WAL").fetchall()
    dbapi.execute("PRAGMA synchronous = NORMAL")
    info["idempotent_tasks_sqlite"] = True


def _dialect_name(engine: Engine) -> str:
    dialect = engine.dialect
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        return "postgresql"
    if dialect.name == "sqlite" and dialect.driver == "pysqlite":
        return "sqlite"
    raise ConfigurationError(
        f"SQLStore supports PostgreSQL through psycopg 3 and SQLite through sqlite3, not "
        f"{dialect.name}+{dialect.driver}"
    )


def _make_engine(url_or_engine: str | Engine, timeout: float, pool_size: int) -> Engine:
    """Build (never connect) an engine; an Engine passed in is used as it is."""
    if isinstance(url_or_engine, Engine):
        return url_or_engine
    try:
        url = sa.make_url(url_or_engine)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"invalid SQLStore URL: {exc}") from exc
    pool: dict[str, Any] = {
        "pool_size": pool_size,
        "max_overflow": pool_size,
        "pool_timeout": timeout,
        "pool_pre_ping": True,
    }
    if url.drivername in _PG_DRIVERS:
        url = url.set(drivername="postgresql+psycopg")
        connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(timeout))}
    elif url.drivername in _SQLITE_DRIVERS:
        if url.database in (None, "", ":memory:") or "mode=memory" in str(url):
            raise ConfigurationError(
                "SQLStore needs a SQLite file (sqlite:///path/idem.db): an in-memory database "
                "is private to one connection; use MemoryStore for tests"
            )
        connect_args = {"timeout": timeout, "check_same_thread": False}
    else:
        raise ConfigurationError(
            f"unsupported SQLStore URL scheme {url.drivername!r}: use postgresql+psycopg:// "
            "or sqlite:///"
        )
    try:
        return sa.create_engine(url, connect_args=connect_args, **pool)
    except ImportError as exc:
        raise ConfigurationError(
            "PostgreSQL support needs psycopg 3: pip install 'idempotent-tasks[postgres]'"
        ) from exc
