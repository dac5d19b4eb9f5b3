"""SQLStore's SQL text and the two dialects (PostgreSQL, SQLite) of its primitives.

Every statement is pre-built once per store with bound parameters only; identifiers
(the table names) are quoted by SQLAlchemy's dialect and validated at construction."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .._records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from .base import ClaimRequest, FailureResult, SuccessWrite

_STATUS: Final[Mapping[str, Status]] = {s.value: s for s in Status}


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


def _scope_arrays(scopes: Sequence[Scope]) -> dict[str, Any]:
    """The scopes as three parallel arrays, for the set-based statements' ``unnest``."""
    return {
        "tenants": [s.tenant for s in scopes],
        "operations": [s.operation for s in scopes],
        "keys": [s.key for s in scopes],
    }


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


def _one(cursor: Any, sql: str, params: Mapping[str, Any]) -> Any:
    """First row or None; always drains the result (SQLite ends the statement only then)."""
    cursor.execute(sql, params)
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _created(scope: Scope, p: Mapping[str, Any]) -> CreateResult:
    record = StoredRecord.claimed(scope, p["request_hash"], p["token"], p["now"], p["lease"])
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
        select_new = (
            "SELECT true, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::float8, "
            "NULL::float8, NULL::float8, NULL::float8 FROM ins "
        )
        # The hot path, one round trip: insert, or read the existing record.  DO NOTHING
        # takes no row lock on a duplicate (DO UPDATE ... WHERE would lock it even when the
        # WHERE is false, turning every replay into a write).  Zero rows means the
        # conflicting row is newer than this statement's snapshot: the caller runs it again.
        self._claim_sql = _pyformat(
            f"WITH ins AS (INSERT INTO {r} {_INSERT_COLS} VALUES {_NEW_VALUES} "
            "ON CONFLICT (tenant, operation, key) DO NOTHING RETURNING 1) "
            + select_new
            + f"UNION ALL SELECT false, {_RECORD_COLS} FROM {r} "
            f"WHERE {_SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
        )
        # The rare path, when the record read back had expired: insert, or replace an
        # expired record (and reset its counter) atomically, or read the live one.
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
        self._mark_success_many_sql = _pyformat(
            "WITH input AS (SELECT * FROM unnest(:tenants::text[], :operations::text[], "
            ":keys::text[], :tokens::bigint[], :responses::bytea[], :expires::float8[]) "
            "AS i(tenant, operation, key, fencing_token, response, expires_at)) "
            f"UPDATE {r} AS r SET status = 'SUCCESS', response = i.response, "
            "updated_at = :now, lease_expires_at = NULL, expires_at = i.expires_at "
            "FROM input i WHERE r.tenant = i.tenant AND r.operation = i.operation "
            "AND r.key = i.key AND r.status = 'PROCESSING' "
            "AND r.fencing_token = i.fencing_token RETURNING r.tenant, r.operation, r.key"
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
        # Joined on the primary key (as for records): a row-value ``IN (subquery … LIMIT)``
        # was planned as a nested loop over the whole counters table (442 ms per call with
        # 10,000 counters, growing with the table).
        self._delete_counters_sql = _pyformat(
            f"WITH doomed AS (SELECT tenant, operation, key FROM {c} AS cc "
            "WHERE cc.updated_at < :before "
            f"AND NOT EXISTS (SELECT 1 FROM {r} AS r WHERE r.tenant = cc.tenant "
            "AND r.operation = cc.operation AND r.key = cc.key) "
            "ORDER BY cc.updated_at LIMIT :limit FOR UPDATE SKIP LOCKED) "
            f"DELETE FROM {c} AS c USING doomed WHERE c.tenant = doomed.tenant "
            "AND c.operation = doomed.operation AND c.key = doomed.key"
        )

    def create(self, cur: Any, scope: Scope, p: Mapping[str, Any]) -> CreateResult | None:
        row = _one(cur, self._claim_sql, p)
        if row is not None and not row[0]:
            duplicate = _live_duplicate(scope, row[1:], p["now"])
            if duplicate is not None:
                return duplicate
            row = _one(cur, self._create_sql, p)  # expired: replace it atomically
            if row is not None and not row[0]:
                return _live_duplicate(scope, row[1:], p["now"])
        if row is None:
            return None  # raced with an insert newer than our snapshot: run it again
        return _created(scope, p)

    def create_many(
        self, cur: Any, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> list[CreateResult | None]:
        params = _scope_arrays([c.scope for c in claims])
        params.update(
            hashes=[c.request_hash for c in claims], tokens=[c.token for c in claims],
            now=now, lease=lease,
        )
        cur.execute(self._create_many_sql, params)
        results: list[CreateResult | None] = []
        for claim, row in zip(claims, cur.fetchall(), strict=True):
            if row[1]:
                record = StoredRecord.claimed(
                    claim.scope, claim.request_hash, claim.token, now, lease
                )
                results.append(CreateResult(CreateOutcome.CREATED, record))
            else:
                results.append(_live_duplicate(claim.scope, row[2:], now))
        return results

    def mark_success_many(
        self, cur: Any, writes: Sequence[SuccessWrite], now: float
    ) -> list[bool]:
        """One set-based ``UPDATE``, each row conditional on its own status and token."""
        params = _scope_arrays([w.scope for w in writes])
        params.update(
            tokens=[w.token for w in writes], responses=[w.response for w in writes],
            expires=[w.expires_at for w in writes], now=now,
        )
        cur.execute(self._mark_success_many_sql, params)
        done = {Scope(*row) for row in cur.fetchall()}
        return [w.scope in done for w in writes]

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
            f"DELETE FROM {c} WHERE rowid IN (SELECT cc.rowid FROM {c} AS cc "
            "WHERE cc.updated_at < :before AND NOT EXISTS (SELECT 1 FROM "
            f"{r} AS r WHERE r.tenant = cc.tenant AND r.operation = cc.operation "
            "AND r.key = cc.key) ORDER BY cc.updated_at LIMIT :limit)"
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

    def mark_success_many(
        self, cur: Any, writes: Sequence[SuccessWrite], now: float
    ) -> list[bool]:
        """Every conditional ``UPDATE`` in one transaction (one commit)."""
        cur.execute(self.begin)
        done = []
        for w in writes:
            p = _scope_params(w.scope)
            p.update(token=w.token, response=w.response, now=now, expires_at=w.expires_at)
            cur.execute(self._c.mark_success, p)
            done.append(cur.rowcount == 1)
        cur.execute("COMMIT")
        return done

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


def _identity(sql: str) -> str:
    return sql
