"""SQLStore on MySQL 8 / MariaDB 10.11 through PyMySQL: the statements and the claim logic.

* Atomic primitive: the primary key ``(tenant, operation, key)`` with ``INSERT IGNORE``.  A
  fresh claim is one autocommit statement; ``INSERT IGNORE`` answers "inserted" (1) or
  "a record exists" (0) — the semantics of PostgreSQL's ``ON CONFLICT DO NOTHING`` — and a
  duplicate then reads the record (two statements: MySQL has no ``RETURNING``).  Every
  other write is one conditional statement or a short explicit transaction whose first
  statement locks the record (``SELECT … FOR UPDATE``).
* Isolation: every connection the store uses runs ``READ COMMITTED``.  Under MySQL's default
  ``REPEATABLE READ``, a duplicate-key check takes a *next-key* lock and a locking read of an
  absent row takes a *gap* lock, so concurrent claims of neighbouring keys deadlock;
  ``READ COMMITTED`` locks index records only.  A statement or transaction that InnoDB still
  picks as a deadlock victim (or whose lock wait timed out) changed nothing and is run again
  (a few times, then ``STORE_UNAVAILABLE``).
* Fencing tokens: ``fencing_token`` is the records table's ``AUTO_INCREMENT`` column, so the
  INSERT that creates a record draws its token itself and the driver reports it in the
  statement's answer (``lastrowid``): a claim costs no extra round trip and a duplicate writes
  nothing (it only leaves a gap).  Replacing an expired record, a takeover and a reopen use
  ``REPLACE`` on the row they hold locked, which draws a new, greater value.  Values grow in
  allocation order and are never reused (the counter is persistent on MySQL 8 and MariaDB
  >= 10.2.4).  With ``auto_increment_increment`` > 1 across several writable primaries (Galera,
  group replication in multi-primary mode) tokens would only grow per server: use one primary.
* Strings: scope columns are ``VARBINARY(1020)`` (255 characters of UTF-8), so keys compare
  byte for byte — no collation folds case or ignores trailing spaces (``PAD SPACE``) — and
  sort in code-point order like every other store.  Responses are ``LONGBLOB``.
* ``count`` of a retry counter is read back with ``LAST_INSERT_ID(count + 1)``: the increment
  and its result are one statement.
* Maintenance: ``delete_expired`` locks its batch with ``FOR UPDATE SKIP LOCKED`` (MySQL
  >= 8.0.1, MariaDB >= 10.6), so many workers can purge at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from ..._core.records import CREATED, DUPLICATE, CreateResult, Scope, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from . import _statements as q

#: Bytes of a scope column: 255 characters of UTF-8 (4 bytes each); three of them fit
#: InnoDB's 3072-byte key limit.
SCOPE_BYTES: Final = 1020
#: Deadlock victim, lock wait timeout: the statement (or transaction) changed nothing.
_RETRYABLE: Final = frozenset({1213, 1205})
_ATTEMPTS: Final = 5
_KEY_RE: Final = re.compile(r"(?<![:\w`])key\b")
_COLS: Final = (
    "tenant, operation, `key`, status, request_hash, response, created_at, updated_at, "
    "lease_expires_at, expires_at"
)
_PK: Final = "(tenant, operation, `key`)"

_T = TypeVar("_T")


def mysql_sql(sql: str) -> str:
    """The shared statements in MySQL's spelling: ``key`` is a reserved word (quoted), and
    ``:name`` placeholders become PyMySQL's ``%(name)s``."""
    return q.pyformat(_KEY_RE.sub("`key`", sql))


class MySQLCommon(q.Common):
    """The shared single statements, respelled; the ones MySQL cannot say in one statement
    (``RETURNING``, ``ON CONFLICT … WHERE``) are replaced by what :class:`MySQLOps` runs."""

    def __init__(self, records: str, counters: str, locks: str) -> None:
        super().__init__(records, counters, locks, mysql_sql)
        r, c, lk = records, counters, locks
        self.bump = mysql_sql(
            f"INSERT INTO {c} (tenant, operation, key, count, updated_at) "
            "VALUES (:tenant, :operation, :key, 1, :now) "
            "ON DUPLICATE KEY UPDATE count = LAST_INSERT_ID(count + 1), updated_at = :now"
        )
        locked = f"SELECT {q.RECORD_COLS} FROM {r} WHERE {q.SCOPE}"
        self.delete_record = mysql_sql(f"{locked} FOR UPDATE")
        self.delete_record_status = mysql_sql(
            f"{locked} AND status = :status FOR UPDATE"
        )
        self.delete_scope = mysql_sql(f"DELETE FROM {r} WHERE {q.SCOPE}")
        self.acquire_lock = mysql_sql(
            f"INSERT IGNORE INTO {lk} (name, owner, expires_at) VALUES (:name, :owner, :expires_at)"
        )
        self.save_steps = mysql_sql(
            f"INSERT INTO {c} (tenant, operation, key, count, updated_at, steps) "
            f"{q.steps_source(r, ' LOCK IN SHARE MODE')} ON DUPLICATE KEY UPDATE steps = :steps"
        )
        self.take_lock = mysql_sql(
            f"UPDATE {lk} SET owner = :owner, expires_at = :expires_at "
            "WHERE name = :name AND (owner = :owner OR expires_at <= :now)"
        )


def _code(exc: BaseException) -> Any:
    args = getattr(exc, "args", ())
    return args[0] if args else None


class MySQLOps:
    """The MySQL statements of the primitives that differ between the dialects."""

    def __init__(self, r: str, c: str, common: MySQLCommon, dbapi_error: type[BaseException]):
        self._r, self._c, self._q = r, c, common
        self._error = dbapi_error
        self._insert_sql = mysql_sql(
            f"INSERT IGNORE INTO {r} ({_COLS}) VALUES (:tenant, :operation, :key, 'PROCESSING', "
            ":request_hash, NULL, :now, :now, :lease, NULL)"
        )
        self._replace_sql = mysql_sql(
            f"REPLACE INTO {r} ({_COLS}) VALUES (:tenant, :operation, :key, 'PROCESSING', "
            ":request_hash, NULL, :created_at, :now, :lease, NULL)"
        )
        self._locked_get_sql = common.delete_record  # the record, row-locked
        self._owned_sql = mysql_sql(
            f"SELECT request_hash, created_at FROM {r} WHERE {q.OWNED} FOR UPDATE"
        )
        self._owned_expired_sql = mysql_sql(
            f"SELECT request_hash, created_at FROM {r} WHERE {q.OWNED}{q.LEASE_EXPIRED} FOR UPDATE"
        )
        self._settled_sql = mysql_sql(f"SELECT request_hash FROM {r} WHERE {q.SETTLED} FOR UPDATE")
        self._doomed_records_sql = mysql_sql(
            f"SELECT tenant, operation, key FROM {r} WHERE expires_at <= :now "
            "ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED"
        )
        self._stale_counters_sql = mysql_sql(
            f"SELECT cc.tenant, cc.operation, cc.key FROM {c} AS cc WHERE cc.updated_at < :before "
            f"AND NOT EXISTS (SELECT 1 FROM {r} AS r WHERE r.tenant = cc.tenant "
            "AND r.operation = cc.operation AND r.key = cc.key) "
            "ORDER BY cc.updated_at LIMIT :limit"
        )

    # -- running ------------------------------------------------------------------------------
    def _again(self, exc: BaseException, attempt: int) -> bool:
        return (
            isinstance(exc, self._error) and _code(exc) in _RETRYABLE and attempt < _ATTEMPTS - 1
        )

    def _statement(self, cur: Any, sql: str, params: Any) -> int:
        """One autocommit statement, run again if InnoDB rolled it back (a deadlock victim)."""
        for attempt in range(_ATTEMPTS):
            try:
                cur.execute(sql, params)
                return int(cur.rowcount)
            except BaseException as exc:
                if not self._again(exc, attempt):
                    raise
        raise AssertionError("unreachable")

    def _transaction(self, cur: Any, fn: Callable[[Any], _T]) -> _T:
        """``fn(cur)`` in one transaction, committed; rolled back and run again when InnoDB
        picked it as a deadlock victim (it then changed nothing)."""
        conn = cur.connection
        for attempt in range(_ATTEMPTS):
            conn.begin()
            try:
                result = fn(cur)
                conn.commit()
                return result
            except BaseException as exc:
                conn.rollback()
                if not self._again(exc, attempt):
                    raise
        raise AssertionError("unreachable")

    # -- claims -------------------------------------------------------------------------------
    def create(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        """The hot path: one ``INSERT IGNORE``; on a duplicate, read the record (live: the
        DUPLICATE; expired: replace it under its row lock; gone meanwhile: None = again)."""
        if self._statement(cur, self._insert_sql, p) == 1:
            return q.created(scope, p, cur.lastrowid)
        row = q.one(cur, self._q.get, p)
        if row is None:
            return None
        found = q.record(scope, row)
        if found.expires_at is None or found.expires_at > p["now"]:
            return CreateResult(DUPLICATE, found)
        return self._transaction(cur, lambda c: self._replace_expired(c, scope, p))

    def _replace_expired(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        row = q.one(cur, self._locked_get_sql, p)
        if row is None:
            return None  # purged meanwhile: claim it with a fresh INSERT
        found = q.record(scope, row)
        if found.expires_at is None or found.expires_at > p["now"]:
            return CreateResult(DUPLICATE, found)  # replaced by someone else
        cur.execute(self._q.reset_count, p)  # re-created after expiry: a fresh counter
        cur.execute(self._replace_sql, {**p, "created_at": p["now"]})
        return q.created(scope, p, cur.lastrowid)

    def create_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> list[CreateResult | None]:
        """Read the batch's records (one statement), then insert every absent scope in one
        multi-row ``INSERT IGNORE`` inside a transaction that reads the tokens drawn.  If a
        concurrent claimant won any of them, the transaction is rolled back and those claims
        come back None (the caller claims each of them on its own); expired records too."""
        scopes = [c.scope for c in claims]
        found = self._records_of(cur, scopes)
        results: list[CreateResult | None] = []
        missing: list[ClaimRequest] = []
        for claim in claims:
            rec = found.get(claim.scope)
            if rec is None:
                missing.append(claim)
            live = rec is not None and (rec.expires_at is None or rec.expires_at > now)
            results.append(CreateResult(DUPLICATE, rec) if live and rec else None)
        if missing:
            tokens = self._transaction(cur, lambda c: self._insert_many(c, missing, now, lease))
            for i, claim in enumerate(claims):
                token = tokens.get(claim.scope)
                if token is not None:
                    mine = StoredRecord.claimed(claim.scope, claim.request_hash, token, now, lease)
                    results[i] = CreateResult(CREATED, mine)
        return results

    def _records_of(self, cur: Any, scopes: Sequence[Scope]) -> dict[Scope, StoredRecord]:
        sql = (
            f"SELECT tenant, operation, `key`, {q.RECORD_COLS} FROM {self._r} "
            f"WHERE {_PK} IN ({_rows(len(scopes), 3)})"
        )
        cur.execute(sql, [part for s in scopes for part in s])
        return {r.scope: r for r in map(q.scoped_record, cur.fetchall())}

    def _insert_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> dict[Scope, int]:
        values = ", ".join(["(%s, %s, %s, 'PROCESSING', %s, NULL, %s, %s, %s, NULL)"] * len(claims))
        params = [v for c in claims for v in (*c.scope, c.request_hash, now, now, lease)]
        cur.execute(f"INSERT IGNORE INTO {self._r} ({_COLS}) VALUES {values}", params)
        if cur.rowcount != len(claims):
            cur.connection.rollback()  # someone else claimed one: nothing of ours stays
            cur.connection.begin()
            return {}
        cur.execute(
            f"SELECT tenant, operation, `key`, fencing_token FROM {self._r} "
            f"WHERE {_PK} IN ({_rows(len(claims), 3)})",
            [part for c in claims for part in c.scope],
        )
        return {Scope(t, o, k): int(tok) for t, o, k, tok in cur.fetchall()}

    def mark_success_many(
        self, cur: Any, writes: Sequence[SuccessWrite], now: float
    ) -> list[bool]:
        """One transaction: lock the batch's PROCESSING records, then one ``UPDATE`` joined on
        the writes that still own theirs; the locked read says which ones did."""
        return self._transaction(cur, lambda c: self._success_many(c, writes, now))

    def _success_many(self, cur: Any, writes: Sequence[SuccessWrite], now: float) -> list[bool]:
        cur.execute(
            f"SELECT tenant, operation, `key`, fencing_token FROM {self._r} "
            f"WHERE {_PK} IN ({_rows(len(writes), 3)}) AND status = 'PROCESSING' FOR UPDATE",
            [part for w in writes for part in w.scope],
        )
        owners = {Scope(t, o, k): int(tok) for t, o, k, tok in cur.fetchall()}
        owned = [w for w in writes if owners.get(w.scope) == w.token]
        if owned:
            rows = " UNION ALL ".join(
                ["SELECT %s AS t, %s AS o, %s AS k, %s AS tok, %s AS resp, %s AS ex"] * len(owned)
            )
            cur.execute(
                f"UPDATE {self._r} AS r JOIN ({rows}) AS i ON r.tenant = i.t "
                "AND r.operation = i.o AND r.`key` = i.k SET r.status = 'SUCCESS', "
                "r.response = i.resp, r.updated_at = %s, r.lease_expires_at = NULL, "
                "r.expires_at = i.ex WHERE r.status = 'PROCESSING' AND r.fencing_token = i.tok",
                [v for w in owned for v in (*w.scope, w.token, w.response, w.expires_at)] + [now],
            )
        done = {w.scope for w in owned}
        return [w.scope in done for w in writes]

    # -- conditional multi-statement writes ---------------------------------------------------
    def take_over(self, cur: Any, p: Mapping[str, Any]) -> TakeOver | None:
        return self._transaction(cur, lambda c: self._take_over(c, p))

    def _take_over(self, cur: Any, p: Mapping[str, Any]) -> TakeOver | None:
        row = q.one(cur, self._owned_expired_sql, p)
        if row is None:
            return None
        cur.execute(self._replace_sql, {**p, "request_hash": row[0], "created_at": row[1]})
        token = int(cur.lastrowid)
        return TakeOver(self._bump(cur, p), token)

    def reopen(self, cur: Any, p: Mapping[str, Any]) -> int | None:
        """Lock the settled record, ``REPLACE`` it with a new attempt (a new token, as
        ``take_over`` draws one) and reset the counter, in one transaction."""
        return self._transaction(cur, lambda c: self._reopen(c, p))

    def _reopen(self, cur: Any, p: Mapping[str, Any]) -> int | None:
        row = q.one(cur, self._settled_sql, p)
        if row is None:
            return None
        cur.execute(self._q.reset_count, p)
        cur.execute(self._replace_sql, {**p, "request_hash": row[0], "created_at": p["now"]})
        return int(cur.lastrowid)

    def _bump(self, cur: Any, p: Mapping[str, Any]) -> int:
        cur.execute(self._q.bump, p)
        return int(cur.lastrowid) or 1  # 0: the counter row was just inserted (count 1)

    def record_failure(
        self, cur: Any, p: Mapping[str, Any], only_if_lease_expired: bool
    ) -> FailureResult | None:
        sql = self._owned_expired_sql if only_if_lease_expired else self._owned_sql
        return self._transaction(cur, lambda c: self._record_failure(c, p, sql))

    def _record_failure(self, cur: Any, p: Mapping[str, Any], owned: str) -> FailureResult | None:
        if q.one(cur, owned, p) is None:
            return None
        count = self._bump(cur, p)
        poisoned = count >= p["max_retries"]
        cur.execute(self._q.mark_failed if poisoned else self._q.release, p)
        return FailureResult(count, poisoned=poisoned)

    def delete_record(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> StoredRecord | None:
        """Read (locked) and delete in one transaction; ``p`` may carry ``status``."""
        sql = self._q.delete_record_status if "status" in p else self._q.delete_record

        def run(c: Any) -> StoredRecord | None:
            row = q.one(c, sql, p)
            if row is None:
                return None
            c.execute(self._q.delete_scope, p)
            return q.record(scope, row)

        return self._transaction(cur, run)

    def acquire_lock(self, cur: Any, p: Mapping[str, Any]) -> bool:
        """Insert the lease, or take it over if it is ours or expired: both statements are
        atomic on their own, so two owners can never both succeed."""
        if self._statement(cur, self._q.acquire_lock, p) == 1:
            return True
        return self._statement(cur, self._q.take_lock, p) == 1

    # -- maintenance ----------------------------------------------------------------------------
    def delete_expired(self, cur: Any, p: Mapping[str, Any]) -> int:
        purged = self._transaction(cur, lambda c: self._purge_records(c, p))
        cur.execute(self._stale_counters_sql, p)
        stale = [tuple(row) for row in cur.fetchall()]
        if stale:
            self._transaction(cur, lambda c: self._purge_counters(c, stale, p["before"]))
        return purged

    def _purge_records(self, cur: Any, p: Mapping[str, Any]) -> int:
        cur.execute(self._doomed_records_sql, p)
        doomed = [part for row in cur.fetchall() for part in row]
        if not doomed:
            return 0
        cur.execute(
            f"DELETE FROM {self._r} WHERE {_PK} IN ({_rows(len(doomed) // 3, 3)}) "
            "AND expires_at <= %s",
            [*doomed, p["now"]],
        )
        return int(cur.rowcount)

    def _purge_counters(self, cur: Any, stale: list[tuple[Any, ...]], before: float) -> None:
        """Lock the candidates (skipping any another worker holds), then delete those still
        without a record and still unchanged since ``before``."""
        cur.execute(
            f"SELECT tenant, operation, `key` FROM {self._c} WHERE {_PK} IN "
            f"({_rows(len(stale), 3)}) AND updated_at < %s FOR UPDATE SKIP LOCKED",
            [*(part for row in stale for part in row), before],
        )
        locked = [part for row in cur.fetchall() for part in row]
        if locked:
            cur.execute(
                f"DELETE FROM {self._c} WHERE {_PK} IN ({_rows(len(locked) // 3, 3)}) "
                f"AND NOT EXISTS (SELECT 1 FROM {self._r} AS r WHERE r.tenant = "
                f"{self._c}.tenant AND r.operation = {self._c}.operation "
                f"AND r.`key` = {self._c}.`key`)",
                locked,
            )


def _rows(n: int, width: int) -> str:
    """``(%s, %s, %s), …`` for ``n`` rows of ``width`` placeholders."""
    one = "(" + ", ".join(["%s"] * width) + ")"
    return ", ".join([one] * n)


__all__ = ["SCOPE_BYTES", "MySQLCommon", "MySQLOps", "mysql_sql"]
