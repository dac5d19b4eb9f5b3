"""SQLStore's primitives: the store contract as statements (see the package docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import sqlalchemy as sa

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import BodyTransaction, ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..effects import Resolution
from ._mysql_setup import create_schema as create_mysql_schema
from ._plumbing import SQLBodyTransaction, SQLPlumbing
from ._postgres import create_fencing_sequence, drop_fencing_sequence
from ._schema import (
    create_missing_indexes,
    rebuild_partial_indexes,
    refuse_mismatch,
    schema_extensions,
)
from ._sqlite import create_fencing
from ._upgrade import UPGRADABLE, sa_runner, upgrade_schema


class SQLStore(SQLPlumbing):
    """The durable store on PostgreSQL (psycopg 3), MySQL/MariaDB (PyMySQL) or SQLite; see
    the package docstring.  Every primitive is its plan (``protocol.py``) run on a raw
    autocommit connection."""

    # -- claims -----------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        return self._execute("create", self._plans.create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at
        ))

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        if not claims:
            return []
        plan = self._plans.create_many(claims, now=now, lease_expires_at=lease_expires_at)
        return self._execute("create_many", plan)

    def get(self, scope: Scope) -> StoredRecord | None:
        return self._execute("get", self._plans.get(scope))

    # -- conditional writes -----------------------------------------------------------------
    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        return self._execute("take_over", self._plans.take_over(
            scope, expected_token=expected_token, now=now, lease_expires_at=lease_expires_at
        ))

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """A settled record of ``expected_token`` to a new attempt (``stores.reopen``)."""
        return self._execute("reopen", self._plans.reopen(
            scope, expected_token=expected_token, now=now, lease_expires_at=lease_expires_at
        ))

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        return self._execute("heartbeat", self._plans.heartbeat(
            scope, token=token, now=now, lease_expires_at=lease_expires_at
        ))

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        return self._execute("mark_success", self._plans.mark_success(
            scope, token=token, response=response, now=now, expires_at=expires_at
        ))

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        if not writes:
            return []
        return self._execute("mark_success_many", self._plans.mark_success_many(writes, now=now))

    def mark_failed(
        self, scope: Scope, *, token: int, now: float, expires_at: float,
        only_if_lease_expired: bool = False, response: bytes | None = None,
    ) -> bool:
        return self._execute("mark_failed", self._plans.mark_failed(
            scope, token=token, now=now, expires_at=expires_at,
            only_if_lease_expired=only_if_lease_expired, response=response,
        ))

    def release(self, scope: Scope, *, token: int) -> bool:
        return self._execute("release", self._plans.release(scope, token=token))

    def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None:
        return self._execute("record_failure", self._plans.record_failure(
            scope, token=token, now=now, max_retries=max_retries, expires_at=expires_at,
            only_if_lease_expired=only_if_lease_expired,
        ))

    # -- steps and the UNCERTAIN status (stores.effects) ------------------------------------
    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        """The scope's steps on its counter row, fenced by ``token`` (``stores.effects``)."""
        return self._execute("save_steps", self._plans.save_steps(
            scope, token=token, steps=steps, now=now
        ))

    def load_steps(self, scope: Scope) -> bytes | None:
        return self._execute("load_steps", self._plans.load_steps(scope))

    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        return self._execute("mark_uncertain", self._plans.mark_uncertain(
            scope, token=token, now=now, detail=detail
        ))

    def resolve_uncertain(
        self, scope: Scope, *, resolution: Resolution, now: float,
        response: bytes | None = None, expires_at: float | None = None,
    ) -> bool:
        return self._execute("resolve_uncertain", self._plans.resolve_uncertain(
            scope, resolution=resolution, now=now, response=response, expires_at=expires_at
        ))

    # -- counters and operator actions ------------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        return self._execute("get_retry_count", self._plans.get_retry_count(scope))

    def reset_retry_count(self, scope: Scope) -> None:
        self._execute("reset_retry_count", self._plans.reset_retry_count(scope))

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        return self._execute("delete_record", self._plans.delete_record(scope, status=status))

    # -- maintenance ------------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        return self._execute("find_stuck", self._plans.find_stuck(
            now=now, heartbeat_before=heartbeat_before, limit=limit
        ))

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        return self._execute("delete_expired", self._plans.delete_expired(
            now=now, counters_before=counters_before, limit=limit
        ))

    def list_records(
        self, *, status: Status | None = None, operation: str | None = None,
        tenant: str | None = None, limit: int = 100, offset: int = 0,
    ) -> list[StoredRecord]:
        return self._execute("list_records", self._plans.list_records(
            status=status, operation=operation, tenant=tenant, limit=limit, offset=offset
        ))

    def stats(self) -> Mapping[tuple[str, Status], int]:
        return self._execute("stats", self._plans.stats())

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        return self._execute("acquire_lock", self._plans.acquire_lock(
            name, owner=owner, now=now, ttl=ttl
        ))

    def release_lock(self, name: str, *, owner: str) -> None:
        self._execute("release_lock", self._plans.release_lock(name, owner=owner))

    # -- schema -----------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Create what is missing: the tables and indexes, and the source of fencing tokens
        (PostgreSQL: the sequence ``<prefix>_fencing_seq``; SQLite: the table
        ``<prefix>_fencing`` and its triggers; MySQL: the records table's ``AUTO_INCREMENT``
        token column).  On a database made by an earlier version,
        the token source starts above the largest token already stored, the retry counters
        gain their ``steps`` column, the status check admits UNCERTAIN and (SQLite) the
        expires index becomes partial.  Idempotent, and
        safe to run concurrently.

        Raises :class:`ConfigurationError` when a table of the same name exists with other
        columns: the store would otherwise fail on every call, or worse, half-work.
        """
        if self._mysql:
            with (
                self._sa_transaction("create_schema") as (conn, trans, _in),
                self._translated("create_schema"),
            ):
                create_mysql_schema(
                    conn, self._metadata, self.table_prefix, self._records,
                    extend=lambda: self._extend_schema(conn, 0),
                )
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
                    refuse_mismatch(table, inspector, UPGRADABLE)
            upgrade_schema(sa_runner(conn), conn.dialect, self._metadata, self.table_prefix)
            self._metadata.create_all(conn, checkfirst=True)
            create_missing_indexes(conn, self._metadata)
            if self._pg:
                create_fencing_sequence(conn, self.table_prefix, self._records)
            else:
                rebuild_partial_indexes(conn, self._metadata)
                create_fencing(conn, self._fencing_table, self._records)
            self._extend_schema(conn, 0)
            trans.commit()

    def drop_schema(self) -> None:
        """Drop the store's tables and token source (tests, ``demo`` clean-up); idempotent."""
        self._raw.drain(invalidate=False)
        with (
            self._sa_transaction("drop_schema", lock_schema=True) as (conn, trans, _in),
            self._translated("drop_schema"),
        ):
            self._metadata.drop_all(conn, checkfirst=True)
            self._extend_schema(conn, 1)
            if self._pg:
                drop_fencing_sequence(conn, self.table_prefix)
            elif not self._mysql:
                self._fencing_table.drop(conn, checkfirst=True)
            trans.commit()

    def _extend_schema(self, conn: sa.Connection, action: int) -> None:
        """The registered extensions' tables (e.g. the transactional outbox's): ``action``
        0 creates, 1 drops them, inside the caller's transaction."""
        for extension in schema_extensions():
            extension[action](conn, self.table_prefix)

    def close(self) -> None:
        """Stop the change feed's listener; return idle connections; dispose of the engine
        when the store created it."""
        if self._feed is not None:
            self._feed.close()
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
