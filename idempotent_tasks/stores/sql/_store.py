"""SQLStore's primitives: the store contract as statements (see the package docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import sqlalchemy as sa

from ..._core.errors import StoreUnavailableError
from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import BodyTransaction, ClaimRequest, FailureResult, SuccessWrite, TakeOver
from . import _statements as q
from ._mysql import MySQLOps
from ._mysql_setup import create_schema as create_mysql_schema
from ._plumbing import SQLBodyTransaction, SQLPlumbing
from ._postgres import create_fencing_sequence, drop_fencing_sequence
from ._schema import create_missing_indexes, refuse_mismatch
from ._sqlite import create_fencing

#: How often ``create`` re-runs its statement when a concurrent insert was not yet visible.
_CREATE_ATTEMPTS: Final = 50


class SQLStore(SQLPlumbing):
    """The durable store on PostgreSQL (psycopg 3), MySQL/MariaDB (PyMySQL) or SQLite; see
    the package docstring."""

    # -- claims -----------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        params = q.claim_params(scope, request_hash, now, lease_expires_at)
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
                    cur, c.scope, q.claim_params(c.scope, c.request_hash, now, lease_expires_at)
                )
                for c, r in zip(claims, results, strict=True)
            ]

        return self._run("create_many", run)

    def get(self, scope: Scope) -> StoredRecord | None:
        row = self._run("get", lambda cur: q.one(cur, self._common.get, q.scope_params(scope)))
        return None if row is None else q.record(scope, row)

    # -- conditional writes -----------------------------------------------------------------
    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        now: float,
        lease_expires_at: float,
    ) -> TakeOver | None:
        p = q.scope_params(scope)
        p.update(token=expected_token, now=now, lease=lease_expires_at)
        return self._run("take_over", lambda cur: self._ops.take_over(cur, p))

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        p = q.scope_params(scope)
        p.update(token=token, now=now, lease=lease_expires_at)
        return self._rowcount("heartbeat", self._common.heartbeat, p) == 1

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        p = q.scope_params(scope)
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
        response: bytes | None = None,
    ) -> bool:
        sql, p = q.mark_failed(self._common, scope, token, now, expires_at,
                               only_if_lease_expired, response)
        return self._rowcount("mark_failed", sql, p) == 1

    def release(self, scope: Scope, *, token: int) -> bool:
        p = q.scope_params(scope)
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
        p = q.scope_params(scope)
        p.update(token=token, now=now, max_retries=max_retries, expires_at=expires_at)
        return self._run(
            "record_failure", lambda cur: self._ops.record_failure(cur, p, only_if_lease_expired)
        )

    # -- counters and operator actions ------------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        sql = self._common.get_count
        row = self._run("get_retry_count", lambda cur: q.one(cur, sql, q.scope_params(scope)))
        return 0 if row is None else int(row[0])

    def reset_retry_count(self, scope: Scope) -> None:
        self._rowcount("reset_retry_count", self._common.reset_count, q.scope_params(scope))

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        p = q.scope_params(scope)
        sql = self._common.delete_record
        if status is not None:
            p["status"] = Status(status).value
            sql = self._common.delete_record_status
        ops = self._ops
        if isinstance(ops, MySQLOps):  # no DELETE … RETURNING: read locked, then delete
            return self._run("delete_record", lambda cur: ops.delete_record(cur, scope, p))
        row = self._run("delete_record", lambda cur: q.one(cur, sql, p))
        return None if row is None else q.record(scope, row)

    # -- maintenance ------------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        p: dict[str, Any] = {"now": now, "limit": limit, "heartbeat_before": heartbeat_before}
        sql = self._common.find_stuck if heartbeat_before is None else self._common.find_stuck_hb
        rows = self._run("find_stuck", lambda cur: cur.execute(sql, p).fetchall())
        return [q.scoped_record(row) for row in rows]

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
        return [q.scoped_record(row) for row in rows]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        sql = self._common.stats
        rows = self._run("stats", lambda cur: cur.execute(sql).fetchall())
        return {(op, q.STATUS[status]): int(n) for op, status, n in rows}

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        p = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
        ops = self._ops
        if isinstance(ops, MySQLOps):  # no ON CONFLICT … WHERE: insert, else take over
            return self._run("acquire_lock", lambda cur: ops.acquire_lock(cur, p))
        sql = self._common.acquire_lock
        return self._run("acquire_lock", lambda cur: q.one(cur, sql, p)) is not None

    def release_lock(self, name: str, *, owner: str) -> None:
        self._rowcount("release_lock", self._common.release_lock, {"name": name, "owner": owner})

    # -- schema -----------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create what is missing: the tables and indexes, and the source of fencing tokens
        (PostgreSQL: the sequence ``<prefix>_fencing_seq``; SQLite: the table
        ``<prefix>_fencing`` and its triggers; MySQL: the records table's ``AUTO_INCREMENT``
        token column).  On a database made by an earlier version,
        the token source starts above the largest token already stored.  Idempotent, and
        safe to run concurrently.

        Raises :class:`ConfigurationError` when a table of the same name exists with other
        columns: the store would otherwise fail on every call, or worse, half-work.
        """
        from ...outbox._schema import create_schema as create_outbox  # the outbox's tables

        if self._mysql:
            with (
                self._sa_transaction("create_schema") as (conn, trans, _in),
                self._translated("create_schema"),
            ):
                create_mysql_schema(conn, self._metadata, self.table_prefix, self._records)
                create_outbox(conn, self.table_prefix)
                trans.commit()
            return
        tables = list(self._metadata.sorted_tables)
        if not self._pg:
            tables.append(self._fencing_table)
        with (
            self._sa_transaction("create_schema", lock_schema=True) as (conn, trans, _in),
            self._translated("create_schema"),
        ):
            inspector = sa.inspect(conn)
            for table in tables:
                if inspector.has_table(table.name):
                    refuse_mismatch(table, inspector)
            self._metadata.create_all(conn, checkfirst=True)
            create_missing_indexes(conn, self._metadata)
            if self._pg:
                create_fencing_sequence(conn, self.table_prefix, self._records)
            else:
                create_fencing(conn, self._fencing_table, self._records)
            create_outbox(conn, self.table_prefix)
            trans.commit()

    def drop_schema(self) -> None:
        """Drop the store's tables and token source (tests, ``demo`` clean-up); idempotent."""
        from ...outbox._schema import drop_schema as drop_outbox

        self._raw.drain(invalidate=False)
        with (
            self._sa_transaction("drop_schema", lock_schema=True) as (conn, trans, _in),
            self._translated("drop_schema"),
        ):
            self._metadata.drop_all(conn, checkfirst=True)
            drop_outbox(conn, self.table_prefix)
            if self._pg:
                drop_fencing_sequence(conn, self.table_prefix)
            elif not self._mysql:
                self._fencing_table.drop(conn, checkfirst=True)
            trans.commit()

    def close(self) -> None:
        """Return idle connections; dispose of the engine when the store created it."""
        self._raw.drain(invalidate=False)
        if self._owns_engine:
            self._engine.dispose()

    # -- body transactions (docs/transactional.md) ------------------------------------------
    @contextlib.contextmanager
    def body_transaction(self) -> Iterator[BodyTransaction]:
        """A connection with a transaction begun (on SQLite holding the write lock from the
        start); rolled back unless committed; the connection always goes back to the pool."""
        with self._sa_transaction("body_transaction") as (conn, trans, in_txn):
            yield SQLBodyTransaction(self, conn, trans, in_txn)
