"""SQLStore's SQL text shared by both dialects, and the helpers that turn rows into records.

Every statement is pre-built once per store with bound parameters only; identifiers (the
table and sequence names) are quoted by SQLAlchemy's dialect and validated at construction.
Where the dialects differ only in how a new fencing token is drawn, the statement is built
from a *token expression* (``nextval(…)`` on PostgreSQL, the fencing row + 1 on SQLite).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ..._core.errors import ConfigurationError
from ..._core.records import CREATED, DUPLICATE, CreateResult, Scope, Status, StoredRecord

STATUS: Final[Mapping[str, Status]] = {s.value: s for s in Status}

SCOPE: Final = "tenant = :tenant AND operation = :operation AND key = :key"
OWNED: Final = SCOPE + " AND status = 'PROCESSING' AND fencing_token = :token"
LEASE_EXPIRED: Final = " AND (lease_expires_at IS NULL OR lease_expires_at <= :now)"
#: A settled record of the attempt ``:token``: what ``reopen`` may give to a new attempt.
SETTLED: Final = SCOPE + " AND status IN ('SUCCESS', 'FAILED') AND fencing_token = :token"
#: A record parked for an operator: what ``resolve_uncertain`` may change.
UNCERTAIN: Final = SCOPE + " AND status = 'UNCERTAIN'"
RECORD_COLS: Final = (
    "status, request_hash, response, fencing_token, created_at, updated_at, "
    "lease_expires_at, expires_at"
)
INSERT_COLS: Final = (
    "(tenant, operation, key, status, request_hash, response, fencing_token, created_at, "
    "updated_at, lease_expires_at, expires_at)"
)
_PARAM_RE: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def new_values(token: str) -> str:
    """The VALUES row of a fresh claim, its fencing token drawn by the ``token`` expression."""
    return (
        f"(:tenant, :operation, :key, 'PROCESSING', :request_hash, NULL, {token}, :now, :now, "
        ":lease, NULL)"
    )


def replace_set(token: str) -> str:
    """The SET list that turns an expired record into a fresh claim."""
    return (
        "status = 'PROCESSING', request_hash = excluded.request_hash, response = NULL, "
        f"fencing_token = {token}, created_at = excluded.created_at, "
        "updated_at = excluded.updated_at, lease_expires_at = excluded.lease_expires_at, "
        "expires_at = NULL"
    )


def reopen_sql(r: str, token: str) -> str:
    """``reopen``'s conditional UPDATE: the settled record of ``:token`` becomes a new attempt
    (its token drawn by the ``token`` expression, its request hash kept)."""
    return (
        f"UPDATE {r} SET status = 'PROCESSING', response = NULL, fencing_token = {token}, "
        "created_at = :now, updated_at = :now, lease_expires_at = :lease, expires_at = NULL "
        f"WHERE {SETTLED} RETURNING fencing_token"
    )


def steps_source(r: str, lock: str) -> str:
    """The one row ``save_steps`` upserts into the counters, present only while the record is
    PROCESSING with ``:token``; ``lock`` (``FOR SHARE`` where rows lock) holds the record
    row, so a takeover that commits first makes the statement write nothing."""
    return (
        "SELECT :tenant, :operation, :key, 0, :now, :steps "
        f"WHERE EXISTS (SELECT 1 FROM {r} WHERE {OWNED}{lock})"
    )


def pyformat(sql: str) -> str:
    """``:name`` placeholders → psycopg's ``%(name)s`` (casts like ``::bigint`` are kept)."""
    return _PARAM_RE.sub(r"%(\1)s", sql)


def identity(sql: str) -> str:
    return sql


class Common:
    """Statements both dialects run verbatim (single conditional statements)."""

    def __init__(
        self, records: str, counters: str, locks: str, convert: Callable[[str], str],
        lock: str = "",
    ):
        r, c = records, counters
        self.convert = convert
        self.get = convert(f"SELECT {RECORD_COLS} FROM {r} WHERE {SCOPE}")
        self.heartbeat = convert(
            f"UPDATE {r} SET lease_expires_at = :lease, updated_at = :now WHERE {OWNED}"
        )
        self.mark_success = convert(
            f"UPDATE {r} SET status = 'SUCCESS', response = :response, updated_at = :now, "
            f"lease_expires_at = NULL, expires_at = :expires_at WHERE {OWNED}"
        )
        poison = (
            f"UPDATE {r} SET status = 'FAILED', updated_at = :now, lease_expires_at = NULL, "
            f"expires_at = :expires_at WHERE {OWNED}"
        )
        self.mark_failed = convert(poison)
        self.mark_failed_expired = convert(poison + LEASE_EXPIRED)
        kept = poison.replace("status = 'FAILED',", "status = 'FAILED', response = :response,")
        self.mark_failed_response = convert(kept)
        self.mark_failed_response_expired = convert(kept + LEASE_EXPIRED)
        self.release = convert(f"DELETE FROM {r} WHERE {OWNED}")
        self.bump = convert(
            f"INSERT INTO {c} AS c (tenant, operation, key, count, updated_at) "
            "VALUES (:tenant, :operation, :key, 1, :now) "
            "ON CONFLICT (tenant, operation, key) DO UPDATE "
            "SET count = c.count + 1, updated_at = excluded.updated_at RETURNING count"
        )
        self.get_count = convert(f"SELECT count FROM {c} WHERE {SCOPE}")
        self.reset_count = convert(f"DELETE FROM {c} WHERE {SCOPE}")
        delete = f"DELETE FROM {r} WHERE {SCOPE}"
        self.delete_record = convert(f"{delete} RETURNING {RECORD_COLS}")
        self.delete_record_status = convert(
            f"{delete} AND status = :status RETURNING {RECORD_COLS}"
        )
        self._operator_statements(r, locks)
        self._effect_statements(r, c, lock)

    def _effect_statements(self, r: str, c: str, lock: str) -> None:
        """Steps and the UNCERTAIN status (``stores.effects``): the steps live on the counter
        row, so whatever deletes the counter deletes them."""
        convert = self.convert
        self.save_steps = convert(
            f"INSERT INTO {c} AS c (tenant, operation, key, count, updated_at, steps) "
            f"{steps_source(r, lock)} "
            "ON CONFLICT (tenant, operation, key) DO UPDATE SET steps = excluded.steps"
        )
        self.load_steps = convert(f"SELECT steps FROM {c} WHERE {SCOPE}")
        self.mark_uncertain = convert(
            f"UPDATE {r} SET status = 'UNCERTAIN', response = :detail, updated_at = :now, "
            f"lease_expires_at = NULL, expires_at = NULL WHERE {OWNED}"
        )
        self.resolve_done = convert(
            f"UPDATE {r} SET status = 'SUCCESS', response = :response, updated_at = :now, "
            f"expires_at = :expires_at WHERE {UNCERTAIN}"
        )
        self.resolve_fail = convert(
            f"UPDATE {r} SET status = 'FAILED', updated_at = :now, expires_at = :expires_at "
            f"WHERE {UNCERTAIN}"
        )
        self.resolve_retry = convert(f"DELETE FROM {r} WHERE {UNCERTAIN}")

    def _operator_statements(self, r: str, lk: str) -> None:
        convert = self.convert
        stuck = (
            f"SELECT tenant, operation, key, {RECORD_COLS} FROM {r} "
            "WHERE status = 'PROCESSING' AND lease_expires_at <= :now"
        )
        order = " ORDER BY updated_at, tenant, operation, key LIMIT :limit"
        self.find_stuck = convert(stuck + order)
        self.find_stuck_hb = convert(stuck + " AND updated_at < :heartbeat_before" + order)
        self.list_head = f"SELECT tenant, operation, key, {RECORD_COLS} FROM {r}"
        self.list_tail = " ORDER BY created_at, tenant, operation, key LIMIT :limit OFFSET :offset"
        self.stats = f"SELECT operation, status, count(*) FROM {r} GROUP BY operation, status"
        self.acquire_lock = convert(
            f"INSERT INTO {lk} AS l (name, owner, expires_at) VALUES (:name, :owner, :expires_at) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
            "expires_at = excluded.expires_at "
            "WHERE l.owner = excluded.owner OR l.expires_at <= :now RETURNING 1"
        )
        self.release_lock = convert(f"DELETE FROM {lk} WHERE name = :name AND owner = :owner")


# -- rows and parameters ----------------------------------------------------------------------
def scope_params(scope: Scope) -> dict[str, Any]:
    return {"tenant": scope.tenant, "operation": scope.operation, "key": scope.key}


def mark_failed(
    c: Common, scope: Scope, token: int, now: float, expires_at: float,
    only_if_lease_expired: bool, response: bytes | None,
) -> tuple[str, dict[str, Any]]:
    """The ``mark_failed`` statement and its parameters (the sync and async stores' one)."""
    p = scope_params(scope)
    p.update(token=token, now=now, expires_at=expires_at)
    if response is None:
        return (c.mark_failed_expired if only_if_lease_expired else c.mark_failed), p
    p["response"] = response
    kept = c.mark_failed_response
    return (c.mark_failed_response_expired if only_if_lease_expired else kept), p


def take_over_params(scope: Scope, token: int, now: float, lease: float) -> dict[str, Any]:
    p = scope_params(scope)
    p.update(token=token, now=now, lease=lease)
    return p


def failure_params(
    scope: Scope, token: int, now: float, max_retries: int, expires_at: float
) -> dict[str, Any]:
    p = scope_params(scope)
    p.update(token=token, now=now, max_retries=max_retries, expires_at=expires_at)
    return p


def check_intact(intact: bool, scope: Scope) -> None:
    """A body transaction's SUCCESS refuses to run outside its transaction, so it can never
    be committed apart from the body's writes."""
    if not intact:
        raise ConfigurationError(
            "the body committed or rolled back the idempotency transaction itself",
            tenant=scope.tenant, operation=scope.operation, key=scope.key,
        )


def claim_params(scope: Scope, request_hash: str, now: float, lease: float) -> dict[str, Any]:
    """The claim's parameters (one dict literal: this runs on every delivery)."""
    return {
        "tenant": scope.tenant, "operation": scope.operation, "key": scope.key,
        "request_hash": request_hash, "now": now, "lease": lease,
    }


def record(scope: Scope, row: Sequence[Any]) -> StoredRecord:
    """A StoredRecord from the eight ``RECORD_COLS`` values (every replay builds one:
    positional arguments, for speed, in the field order of :class:`StoredRecord`)."""
    response, lease, expires = row[2], row[6], row[7]
    return StoredRecord(
        scope,
        STATUS[row[0]],
        row[1],
        None if response is None else bytes(response),
        int(row[3]),
        float(row[4]),
        float(row[5]),
        None if lease is None else float(lease),
        None if expires is None else float(expires),
    )


def scoped_record(row: Sequence[Any]) -> StoredRecord:
    return record(Scope(row[0], row[1], row[2]), row[3:])


def one(cursor: Any, sql: str, params: Mapping[str, Any]) -> Any:
    """First row or None; always drains the result (SQLite ends the statement only then)."""
    cursor.execute(sql, params)
    rows = cursor.fetchall()
    return rows[0] if rows else None


def created(scope: Scope, p: Mapping[str, Any], token: Any) -> CreateResult:
    """CREATED, built from our own arguments and the token the database drew."""
    claimed = StoredRecord.claimed(scope, p["request_hash"], int(token), p["now"], p["lease"])
    return CreateResult(CREATED, claimed)


def live_duplicate(scope: Scope, row: Sequence[Any], now: float) -> CreateResult | None:
    """The DUPLICATE a claim read, or None when the record read has expired (it is to be
    replaced) or, on PostgreSQL, when the read cannot be trusted.

    PostgreSQL: the conflict check sees the latest row version, the read beside it only the
    statement's snapshot.  When a concurrent transaction inserted the row, or replaced an
    expired one, after that snapshot, the read finds no row or the old expired version; the
    statement must then run again (a live record never looks expired at ``now``: it would have been
    replaced).
    """
    if row[0] is None:
        return None
    found = record(scope, row)
    if found.expires_at is not None and found.expires_at <= now:
        return None
    return CreateResult(DUPLICATE, found)
