"""``SQLiteStore``: an idempotency store on the standard library's ``sqlite3`` module.

An example of a store written outside the library, against the public names of
``idempotent_tasks.stores`` only (docs/stores.md walks through it).  The library ships its own
SQLite support in ``SQLStore("sqlite:///…")``; this one exists to be read.

* **Guarantees**: the whole store contract of ``idempotent_tasks.stores.base``: one winner per
  claim, fencing tokens monotonic per scope, every write conditional on (PROCESSING, token),
  retry counters that outlive their records; and the optional ``reopen`` (``ReopenStore``:
  a settled record given to a new attempt).  ``StoreContract`` checks it
  (tests/stores/test_example_store.py).
* **Atomic primitive**: each call is one ``BEGIN IMMEDIATE`` transaction.  SQLite takes its
  database-wide write lock at ``BEGIN``, so the read and the conditional write after it
  cannot interleave with another writer — a thread of this process (they also share one
  connection behind a lock) or another process on the same file.  Check-then-act is safe
  *inside* that transaction, and only there.
* **Fencing tokens**: one row in ``<prefix>_sequence``, advanced inside the claim's own
  transaction (a first claim, a claim after release or expiry, a takeover, a reopen).
* **Counters**: ``<prefix>_counters``, a row per scope apart from the record; release and
  delete never touch it; replacing an expired record resets it.
* **TTL**: none in the background.  A record with ``expires_at <= now`` counts as absent
  (``create`` replaces it) until ``delete_expired`` purges it.  ``now`` always comes from the
  handler's clock: the store never reads one.
* **Failures**: every ``sqlite3.Error`` becomes ``StoreUnavailableError`` (the handler then
  fails closed: the body does not run).
* **Connection string**: a file path (``":memory:"`` for one process); the constructor does
  not connect, the first call does.  ``prefix`` names the tables.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from idempotent_tasks import StoreUnavailableError
from idempotent_tasks.stores import (
    ClaimRequest,
    CreateOutcome,
    CreateResult,
    FailureResult,
    Scope,
    Status,
    StoredRecord,
    SuccessWrite,
    TakeOver,
)

_COLUMNS = ("tenant, operation, key, status, request_hash, response, fencing_token, "
            "created_at, updated_at, lease_expires_at, expires_at")
_SCOPE = "tenant = ? AND operation = ? AND key = ?"
_OWNED = _SCOPE + " AND status = 'PROCESSING' AND fencing_token = ?"
_LEASE_EXPIRED = " AND lease_expires_at <= ?"


class SQLiteStore:
    name = "sqlite3"

    def __init__(self, path: str, *, prefix: str = "idem") -> None:
        self.path = path
        self.records, self.counters = f"{prefix}_records", f"{prefix}_counters"
        self.locks, self.sequence = f"{prefix}_locks", f"{prefix}_sequence"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    # -- plumbing ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding SQLite's write lock: the contract's atomic step."""
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30,
                                                 check_same_thread=False)
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
            except sqlite3.Error as exc:
                raise StoreUnavailableError(f"sqlite3: {exc}") from exc

    def _read(self, conn: sqlite3.Connection, scope: Scope) -> StoredRecord | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM {self.records} WHERE {_SCOPE}",
                           scope).fetchone()
        return None if row is None else _record(row)

    def _next_token(self, conn: sqlite3.Connection) -> int:
        sql = f"UPDATE {self.sequence} SET value = value + 1 RETURNING value"
        return int(conn.execute(sql).fetchone()[0])

    def _bump(self, conn: sqlite3.Connection, scope: Scope, now: float) -> int:
        sql = (f"INSERT INTO {self.counters} VALUES (?, ?, ?, 1, ?) "
               "ON CONFLICT DO UPDATE SET count = count + 1, updated_at = excluded.updated_at "
               "RETURNING count")
        return int(conn.execute(sql, (*scope, now)).fetchone()[0])

    def _owned(self, conn: sqlite3.Connection, scope: Scope, token: int,
               lease_expired_at: float | None = None) -> bool:
        sql, args = f"SELECT 1 FROM {self.records} WHERE {_OWNED}", [*scope, token]
        if lease_expired_at is not None:
            sql, args = sql + _LEASE_EXPIRED, [*args, lease_expired_at]
        return conn.execute(sql, args).fetchone() is not None

    def _update_owned(self, scope: Scope, token: int, assignments: str, values: Sequence[Any],
                      lease_expired_at: float | None = None) -> bool:
        """The conditional write: changes the record only if it is PROCESSING with ``token``
        (and, when asked, its lease expired); reports whether it did."""
        sql = f"UPDATE {self.records} SET {assignments} WHERE {_OWNED}"
        args = [*values, *scope, token]
        if lease_expired_at is not None:
            sql, args = sql + _LEASE_EXPIRED, [*args, lease_expired_at]
        with self._tx() as conn:
            return conn.execute(sql, args).rowcount == 1

    # -- the hot path --------------------------------------------------------------------
    def _claim(self, conn: sqlite3.Connection, scope: Scope, request_hash: str, now: float,
               lease_expires_at: float) -> CreateResult:
        existing = self._read(conn, scope)
        if existing is not None and not _expired(existing, now):
            return CreateResult(CreateOutcome.DUPLICATE, existing)
        if existing is not None:  # expired: it counts as absent, and the scope starts afresh
            conn.execute(f"DELETE FROM {self.records} WHERE {_SCOPE}", scope)
            conn.execute(f"DELETE FROM {self.counters} WHERE {_SCOPE}", scope)
        record = StoredRecord.claimed(scope, request_hash, self._next_token(conn), now,
                                      lease_expires_at)
        conn.execute(f"INSERT INTO {self.records} ({_COLUMNS}) VALUES "
                     "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _row(record))
        return CreateResult(CreateOutcome.CREATED, record)

    def create(self, scope: Scope, *, request_hash: str, now: float,
               lease_expires_at: float) -> CreateResult:
        with self._tx() as conn:
            return self._claim(conn, scope, request_hash, now, lease_expires_at)

    def create_many(self, claims: Sequence[ClaimRequest], *, now: float,
                    lease_expires_at: float) -> list[CreateResult]:
        with self._tx() as conn:
            return [self._claim(conn, c.scope, c.request_hash, now, lease_expires_at)
                    for c in claims]

    def get(self, scope: Scope) -> StoredRecord | None:
        with self._tx() as conn:
            return self._read(conn, scope)

    def take_over(self, scope: Scope, *, expected_token: int, now: float,
                  lease_expires_at: float) -> TakeOver | None:
        with self._tx() as conn:
            if not self._owned(conn, scope, expected_token, lease_expired_at=now):
                return None
            token = self._next_token(conn)
            conn.execute(f"UPDATE {self.records} SET fencing_token = ?, lease_expires_at = ?, "
                         f"updated_at = ? WHERE {_SCOPE}", (token, lease_expires_at, now, *scope))
            return TakeOver(retry_count=self._bump(conn, scope, now), token=token)

    def reopen(self, scope: Scope, *, expected_token: int, now: float,
               lease_expires_at: float) -> int | None:
        """Optional (``ReopenStore``, for the reuse policies): the settled record of
        ``expected_token`` becomes a new attempt with a new token, its counter reset."""
        with self._tx() as conn:
            record = self._read(conn, scope)
            if (record is None or record.status is Status.PROCESSING
                    or record.fencing_token != expected_token):
                return None
            token = self._next_token(conn)
            conn.execute(f"UPDATE {self.records} SET status = 'PROCESSING', response = NULL, "
                         "fencing_token = ?, created_at = ?, updated_at = ?, "
                         f"lease_expires_at = ?, expires_at = NULL WHERE {_SCOPE}",
                         (token, now, now, lease_expires_at, *scope))
            conn.execute(f"DELETE FROM {self.counters} WHERE {_SCOPE}", scope)
            return token

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        return self._update_owned(scope, token, "lease_expires_at = ?, updated_at = ?",
                                  (lease_expires_at, now))

    def mark_success(self, scope: Scope, *, token: int, response: bytes, now: float,
                     expires_at: float) -> bool:
        return self._update_owned(scope, token, _FINISHED, ("SUCCESS", response, now, expires_at))

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        return [self.mark_success(w.scope, token=w.token, response=w.response, now=now,
                                  expires_at=w.expires_at) for w in writes]

    def mark_failed(self, scope: Scope, *, token: int, now: float, expires_at: float,
                    only_if_lease_expired: bool = False, response: bytes | None = None) -> bool:
        return self._update_owned(scope, token, _FINISHED, ("FAILED", response, now, expires_at),
                                  lease_expired_at=now if only_if_lease_expired else None)

    def release(self, scope: Scope, *, token: int) -> bool:
        with self._tx() as conn:
            return conn.execute(f"DELETE FROM {self.records} WHERE {_OWNED}",
                                (*scope, token)).rowcount == 1

    def record_failure(self, scope: Scope, *, token: int, now: float, max_retries: int,
                       expires_at: float, only_if_lease_expired: bool = False,
                       ) -> FailureResult | None:
        with self._tx() as conn:
            if not self._owned(conn, scope, token, now if only_if_lease_expired else None):
                return None  # no longer ours: nothing is counted
            count = self._bump(conn, scope, now)
            if count >= max_retries:
                conn.execute(f"UPDATE {self.records} SET {_FINISHED} WHERE {_SCOPE}",
                             ("FAILED", None, now, expires_at, *scope))
            else:
                conn.execute(f"DELETE FROM {self.records} WHERE {_SCOPE}", scope)
            return FailureResult(retry_count=count, poisoned=count >= max_retries)

    def get_retry_count(self, scope: Scope) -> int:
        with self._tx() as conn:
            row = conn.execute(f"SELECT count FROM {self.counters} WHERE {_SCOPE}",
                               scope).fetchone()
            return 0 if row is None else int(row[0])

    # -- maintenance ---------------------------------------------------------------------
    def find_stuck(self, *, now: float, heartbeat_before: float | None,
                   limit: int) -> list[StoredRecord]:
        sql = (f"SELECT {_COLUMNS} FROM {self.records} WHERE status = 'PROCESSING' "
               "AND lease_expires_at <= ? AND (? IS NULL OR updated_at < ?) "
               "ORDER BY updated_at LIMIT ?")
        with self._tx() as conn:
            rows = conn.execute(sql, (now, heartbeat_before, heartbeat_before, limit))
            return [_record(row) for row in rows]

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        with self._tx() as conn:
            purged = conn.execute(
                f"DELETE FROM {self.records} WHERE rowid IN (SELECT rowid FROM {self.records} "
                "WHERE expires_at <= ? LIMIT ?)", (now, limit)).rowcount
            conn.execute(
                f"DELETE FROM {self.counters} WHERE rowid IN (SELECT c.rowid FROM "
                f"{self.counters} c WHERE c.updated_at < ? AND NOT EXISTS (SELECT 1 FROM "
                f"{self.records} r WHERE r.tenant = c.tenant AND r.operation = c.operation "
                "AND r.key = c.key) ORDER BY c.updated_at LIMIT ?)", (counters_before, limit))
            return purged

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        with self._tx() as conn:
            row = conn.execute(f"SELECT owner, expires_at FROM {self.locks} WHERE name = ?",
                               (name,)).fetchone()
            if row is not None and row[0] != owner and row[1] > now:
                return False  # someone else holds a live lease
            conn.execute(f"INSERT OR REPLACE INTO {self.locks} VALUES (?, ?, ?)",
                         (name, owner, now + ttl))
            return True

    def release_lock(self, name: str, *, owner: str) -> None:
        with self._tx() as conn:
            conn.execute(f"DELETE FROM {self.locks} WHERE name = ? AND owner = ?", (name, owner))

    # -- operators and deployments -------------------------------------------------------
    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        with self._tx() as conn:
            record = self._read(conn, scope)
            if record is None or (status is not None and record.status is not status):
                return None
            conn.execute(f"DELETE FROM {self.records} WHERE {_SCOPE}", scope)
            return record

    def reset_retry_count(self, scope: Scope) -> None:
        with self._tx() as conn:
            conn.execute(f"DELETE FROM {self.counters} WHERE {_SCOPE}", scope)

    def list_records(self, *, status: Status | None = None, operation: str | None = None,
                     tenant: str | None = None, limit: int = 100,
                     offset: int = 0) -> list[StoredRecord]:
        sql = (f"SELECT {_COLUMNS} FROM {self.records} WHERE (? IS NULL OR status = ?) "
               "AND (? IS NULL OR operation = ?) AND (? IS NULL OR tenant = ?) "
               "ORDER BY created_at, tenant, operation, key LIMIT ? OFFSET ?")
        state = None if status is None else status.value
        with self._tx() as conn:
            rows = conn.execute(sql, (state, state, operation, operation, tenant, tenant,
                                      limit, offset))
            return [_record(row) for row in rows]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        sql = f"SELECT operation, status, COUNT(*) FROM {self.records} GROUP BY 1, 2"
        with self._tx() as conn:
            return {(op, Status(state)): n for op, state, n in conn.execute(sql)}

    def create_schema(self) -> None:
        scope = "tenant TEXT NOT NULL, operation TEXT NOT NULL, key TEXT NOT NULL"
        with self._tx() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.records} ({scope}, status TEXT, "
                         "request_hash TEXT, response BLOB, fencing_token INTEGER, "
                         "created_at REAL, updated_at REAL, lease_expires_at REAL, "
                         "expires_at REAL, PRIMARY KEY (tenant, operation, key))")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.counters} ({scope}, count INTEGER, "
                         "updated_at REAL, PRIMARY KEY (tenant, operation, key))")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.locks} (name TEXT PRIMARY KEY, "
                         "owner TEXT, expires_at REAL)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.sequence} "
                         "(id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL)")
            conn.execute(f"INSERT OR IGNORE INTO {self.sequence} VALUES (1, 0)")

    def drop_schema(self) -> None:
        with self._tx() as conn:
            for table in (self.records, self.counters, self.locks, self.sequence):
                conn.execute(f"DROP TABLE IF EXISTS {table}")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_FINISHED = "status = ?, response = ?, updated_at = ?, expires_at = ?, lease_expires_at = NULL"


def _expired(record: StoredRecord, now: float) -> bool:
    return record.expires_at is not None and record.expires_at <= now


def _row(r: StoredRecord) -> tuple[Any, ...]:
    return (*r.scope, r.status.value, r.request_hash, r.response, r.fencing_token,
            r.created_at, r.updated_at, r.lease_expires_at, r.expires_at)


def _record(row: Sequence[Any]) -> StoredRecord:
    return StoredRecord(scope=Scope(row[0], row[1], row[2]), status=Status(row[3]),
                        request_hash=row[4], response=row[5], fencing_token=row[6],
                        created_at=row[7], updated_at=row[8], lease_expires_at=row[9],
                        expires_at=row[10])
