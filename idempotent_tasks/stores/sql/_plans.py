"""The SQL stores' protocol: every primitive as a *plan*, with no driver in sight
(published as :mod:`idempotent_tasks.stores.sql.protocol`).

A plan is a generator.  It yields :class:`Statement` objects (SQL text in psycopg's
``%(name)s`` style — SQLite's ``:name`` on that dialect — its parameters, and what to fetch:
the rows, or the count of rows affected), receives each statement's answer back, and
returns the primitive's result: a ``CreateResult``, a ``bool``, a record…  It never calls a
driver, never awaits and never imports one, so the same plan is driven by the sync store
(on a DBAPI cursor) and by the async store (``psycopg.AsyncConnection`` or asyncpg), the
way one authentication flow serves a sync and an async HTTP client.  Whatever needs more
than one statement (a claim that found an expired record, a batch claim with stragglers,
the retry of a claim that raced a concurrent insert) is written here once.

Guarantees carried by the plans: every write on an existing record is conditional on
``status = 'PROCESSING'`` and the fencing token (``reopen``'s on a settled status and the
token); a claim is one statement (one round trip)
unless it meets an expired record; timestamps come from the caller, never the server.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

from ..._core.errors import ConfigurationError, StoreUnavailableError
from ..._core.records import CREATED, CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from . import _postgres as pg
from ._arrays import bytea_array, number_array, scope_arrays, text_array
from ._errors import SCHEMA_MISSING, schema_missing, translate
from ._schema import (
    DEFAULT_TABLE_PREFIX,
    build_metadata,
    fencing_sequence,
    refuse_mismatch,
    register_schema_extension,
)
from ._sqlite import fencing_table
from ._statements import (
    LEASE_EXPIRED,
    STATUS,
    Common,
    claim_params,
    created,
    failure_params,
    identity,
    live_duplicate,
    mark_failed,
    pyformat,
    record,
    scope_params,
    scoped_record,
    take_over_params,
)

_T = TypeVar("_T")

#: What a statement's answer is: its rows (a list of row sequences) …
ROWS: Final = 0
#: … or the number of rows it affected.
COUNT: Final = 1
#: How often ``create`` re-runs its statement when a concurrent insert was not yet visible.
CREATE_ATTEMPTS: Final = 50

DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_POOL_SIZE: Final = 10
#: Seconds a PostgreSQL call may wait for its answer before its connection is broken.
DEFAULT_SOCKET_TIMEOUT: Final = 30.0


#: One statement of a plan, a plain tuple ``(sql, params, fetch)``: what a transport sends
#: (SQL text and its named parameters) and what it must answer with (``ROWS`` or ``COUNT``).
#: A tuple, not a class: building it costs no Python call on the hot path.
Statement: TypeAlias = tuple[str, Mapping[str, Any], int]


#: A primitive's plan: yields steps, receives their answers, returns the result.
Plan: TypeAlias = Generator[Any, Any, _T]


class CommonPlans:
    """The plans every dialect shares (single conditional statements of :class:`Common`),
    and the claim loop; the dialect supplies ``_claim``, ``_claim_many`` and the other
    primitives its SQL differs in."""

    def __init__(self, name: str, common: Common) -> None:
        self.name = name
        self.common = common

    # -- claims ---------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> Plan[CreateResult]:
        p = claim_params(scope, request_hash, now, lease_expires_at)
        for _ in range(CREATE_ATTEMPTS):
            result = yield from self._claim(scope, p)
            if result is not None:
                return result
        raise StoreUnavailableError(f"{self.name} store: create kept racing concurrent writers")

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> Plan[list[CreateResult]]:
        """One statement for the batch; a claim whose read could not be trusted (a racing
        insert) runs again on its own."""
        if not claims:
            return []
        found = yield from self._claim_many(claims, now, lease_expires_at)
        results: list[CreateResult] = []
        for claim, result in zip(claims, found, strict=True):
            results.append(result if result is not None else (yield from self.create(
                claim.scope, request_hash=claim.request_hash, now=now,
                lease_expires_at=lease_expires_at,
            )))
        return results

    def _claim(self, scope: Scope, p: Mapping[str, Any]) -> Plan[CreateResult | None]:
        raise NotImplementedError

    def _claim_many(
        self, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> Plan[list[CreateResult | None]]:
        raise NotImplementedError

    # The primitives whose SQL differs: each dialect writes these.
    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[TakeOver | None]:
        raise NotImplementedError

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[int | None]:
        raise NotImplementedError

    def mark_success_many(
        self, writes: Sequence[SuccessWrite], *, now: float
    ) -> Plan[list[bool]]:
        raise NotImplementedError

    def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> Plan[FailureResult | None]:
        raise NotImplementedError

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> Plan[int]:
        raise NotImplementedError

    def get(self, scope: Scope) -> Plan[StoredRecord | None]:
        rows = yield (self.common.get, scope_params(scope), ROWS)
        return record(scope, rows[0]) if rows else None

    # -- conditional writes ---------------------------------------------------------------
    def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> Plan[bool]:
        p = scope_params(scope)
        p.update(token=token, now=now, lease=lease_expires_at)
        return bool((yield (self.common.heartbeat, p, COUNT)) == 1)

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> Plan[bool]:
        p = scope_params(scope)
        p.update(token=token, response=response, now=now, expires_at=expires_at)
        return bool((yield (self.common.mark_success, p, COUNT)) == 1)

    def mark_failed(
        self, scope: Scope, *, token: int, now: float, expires_at: float,
        only_if_lease_expired: bool = False, response: bytes | None = None,
    ) -> Plan[bool]:
        sql, p = mark_failed(
            self.common, scope, token, now, expires_at, only_if_lease_expired, response
        )
        return bool((yield (sql, p, COUNT)) == 1)

    def release(self, scope: Scope, *, token: int) -> Plan[bool]:
        p = scope_params(scope)
        p["token"] = token
        return bool((yield (self.common.release, p, COUNT)) == 1)

    # -- steps and the UNCERTAIN status (stores.effects) ------------------------------------
    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> Plan[bool]:
        """One upsert of the counter row, conditional on the record being PROCESSING with
        ``token`` (and, where rows lock, holding the record row while it writes)."""
        p = scope_params(scope)
        p.update(token=token, steps=steps, now=now)
        return bool((yield (self.common.save_steps, p, COUNT)) >= 1)

    def load_steps(self, scope: Scope) -> Plan[bytes | None]:
        rows = yield (self.common.load_steps, scope_params(scope), ROWS)
        return None if not rows or rows[0][0] is None else bytes(rows[0][0])

    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> Plan[bool]:
        p = scope_params(scope)
        p.update(token=token, now=now, detail=detail)
        return bool((yield (self.common.mark_uncertain, p, COUNT)) == 1)

    def resolve_uncertain(
        self, scope: Scope, *, resolution: str, now: float, response: bytes | None = None,
        expires_at: float | None = None,
    ) -> Plan[bool]:
        """Only an UNCERTAIN record changes; ``retry`` deletes it (counter and steps kept)."""
        p = scope_params(scope)
        p.update(now=now, response=response, expires_at=expires_at)  # each takes its own
        c = self.common
        sql = {"done": c.resolve_done, "retry": c.resolve_retry}.get(resolution, c.resolve_fail)
        return bool((yield (sql, p, COUNT)) == 1)

    # -- counters and operator actions ----------------------------------------------------
    def get_retry_count(self, scope: Scope) -> Plan[int]:
        rows = yield (self.common.get_count, scope_params(scope), ROWS)
        return int(rows[0][0]) if rows else 0

    def reset_retry_count(self, scope: Scope) -> Plan[None]:
        yield (self.common.reset_count, scope_params(scope), COUNT)

    def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> Plan[StoredRecord | None]:
        p = scope_params(scope)
        sql = self.common.delete_record
        if status is not None:
            p["status"] = Status(status).value
            sql = self.common.delete_record_status
        rows = yield (sql, p, ROWS)
        return record(scope, rows[0]) if rows else None

    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> Plan[list[StoredRecord]]:
        p: dict[str, Any] = {"now": now, "limit": limit}
        sql = self.common.find_stuck
        if heartbeat_before is not None:
            p["heartbeat_before"] = heartbeat_before
            sql = self.common.find_stuck_hb
        return [scoped_record(row) for row in (yield (sql, p, ROWS))]

    def list_records(
        self, *, status: Status | None = None, operation: str | None = None,
        tenant: str | None = None, limit: int = 100, offset: int = 0,
    ) -> Plan[list[StoredRecord]]:
        filters = {
            "status": None if status is None else Status(status).value,
            "operation": operation,
            "tenant": tenant,
        }
        used = {k: v for k, v in filters.items() if v is not None}
        where = " AND ".join(f"{k} = :{k}" for k in used)
        c = self.common
        sql = c.convert(c.list_head + (f" WHERE {where}" if where else "") + c.list_tail)
        rows = yield (sql, {**used, "limit": limit, "offset": offset}, ROWS)
        return [scoped_record(row) for row in rows]

    def stats(self) -> Plan[Mapping[tuple[str, Status], int]]:
        rows = yield (self.common.stats, {}, ROWS)
        return {(op, STATUS[status]): int(n) for op, status, n in rows}

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> Plan[bool]:
        p = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
        return bool((yield (self.common.acquire_lock, p, ROWS)))

    def release_lock(self, name: str, *, owner: str) -> Plan[None]:
        yield (self.common.release_lock, {"name": name, "owner": owner}, COUNT)


class PostgresPlans(CommonPlans):
    """PostgreSQL: every primitive one statement (data-modifying CTEs for the multi-row
    ones); fencing tokens from the sequence ``<prefix>_fencing_seq``."""

    def __init__(self, records: str, counters: str, locks: str, sequence: str) -> None:
        super().__init__(
            "postgresql", Common(records, counters, locks, pyformat, lock=" FOR SHARE")
        )
        s = pg.Statements(records, counters, sequence)
        self.sql = s

    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> Plan[CreateResult]:
        """The common cases flat, for speed (a first delivery and a duplicate of a live record
        are one statement and no sub-generator); an expired record is replaced as in
        :meth:`_claim`, and a claim that raced goes to :meth:`CommonPlans.create`'s loop."""
        p = claim_params(scope, request_hash, now, lease_expires_at)
        rows = yield (self.sql.claim, p, ROWS)
        if rows:  # a first delivery (created) or a duplicate of a live record: done
            row = rows[0]
            if row[0]:
                return created(scope, p, row[4])
            duplicate = live_duplicate(scope, row[1:], now)
            if duplicate is not None:
                return duplicate
        first = yield from self._claimed(scope, p, rows)  # expired, or a racing insert
        if first is not None:
            return first
        return (yield from super().create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at
        ))

    def _claim(self, scope: Scope, p: Mapping[str, Any]) -> Plan[CreateResult | None]:
        """Insert, or read the live record; an expired one is replaced by a second
        statement.  None: the read raced an insert newer than its snapshot (run again)."""
        rows = yield (self.sql.claim, p, ROWS)
        return (yield from self._claimed(scope, p, rows))

    def _claimed(
        self, scope: Scope, p: Mapping[str, Any], rows: Any
    ) -> Plan[CreateResult | None]:
        """What the claim statement's ``rows`` mean (see :meth:`_claim`)."""
        if rows and not rows[0][0]:
            duplicate = live_duplicate(scope, rows[0][1:], p["now"])
            if duplicate is not None:
                return duplicate
            rows = yield (self.sql.create, p, ROWS)  # expired: replace it atomically
            if rows and not rows[0][0]:
                return live_duplicate(scope, rows[0][1:], p["now"])
        return created(scope, p, rows[0][4]) if rows else None

    def _claim_many(
        self, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> Plan[list[CreateResult | None]]:
        params = scope_arrays([c.scope for c in claims])
        params.update(hashes=text_array([c.request_hash for c in claims]), now=now, lease=lease)
        rows = yield (self.sql.create_many, params, ROWS)
        results: list[CreateResult | None] = []
        for claim, row in zip(claims, rows, strict=True):
            if row[0]:
                claimed = StoredRecord.claimed(
                    claim.scope, claim.request_hash, int(row[1]), now, lease
                )
                results.append(CreateResult(CREATED, claimed))
            else:
                results.append(live_duplicate(claim.scope, row[2:], now))
        return results

    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[TakeOver | None]:
        p = take_over_params(scope, expected_token, now, lease_expires_at)
        rows = yield (self.sql.take_over, p, ROWS)
        return TakeOver(int(rows[0][0]), int(rows[0][1])) if rows else None

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[int | None]:
        """One statement (see ``_postgres``): the record and its counter reset together."""
        p = take_over_params(scope, expected_token, now, lease_expires_at)
        rows = yield (self.sql.reopen, p, ROWS)
        return int(rows[0][0]) if rows else None

    def mark_success_many(
        self, writes: Sequence[SuccessWrite], *, now: float
    ) -> Plan[list[bool]]:
        """One set-based ``UPDATE``, each row conditional on its own status and token."""
        if not writes:
            return []
        params = scope_arrays([w.scope for w in writes])
        params.update(tokens=number_array([w.token for w in writes]), now=now,
                      responses=bytea_array([w.response for w in writes]),
                      expires=number_array([w.expires_at for w in writes]))
        rows = yield (self.sql.mark_success_many, params, ROWS)
        done = {writes[row[0] - 1].scope for row in rows}  # the input positions written
        return [w.scope in done for w in writes]

    def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> Plan[FailureResult | None]:
        p = failure_params(scope, token, now, max_retries, expires_at)
        sql = self.sql.record_failure_expired if only_if_lease_expired else self.sql.record_failure
        rows = yield (sql, p, ROWS)
        if not rows:
            return None
        count = int(rows[0][0])
        return FailureResult(count, poisoned=count >= max_retries)

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> Plan[int]:
        p = {"now": now, "before": counters_before, "limit": limit}
        purged = yield (self.sql.delete_records, p, COUNT)
        yield (self.sql.delete_counters, p, COUNT)
        return int(purged)


def postgres_plans(prefix: str) -> PostgresPlans:
    """The PostgreSQL plans of the store with ``table_prefix`` ``prefix``."""
    from sqlalchemy.dialects import postgresql

    quote = postgresql.dialect().identifier_preparer.quote  # type: ignore[no-untyped-call]
    names = ("records", "retry_counters", "locks", "fencing_seq")
    r, c, lk, seq = (quote(f"{prefix}_{t}") for t in names)
    return PostgresPlans(r, c, lk, seq)


def check_options(
    table_prefix: str, connect_timeout: float, pool_size: int, socket_timeout: float | None
) -> None:
    """The constructor checks both SQL stores share."""
    if not isinstance(table_prefix, str) or not pg.PREFIX_RE.fullmatch(table_prefix):
        raise ConfigurationError(
            f"table_prefix {table_prefix!r} must be 1-40 characters of letters, digits and "
            "underscores, not starting with a digit"
        )
    if connect_timeout <= 0 or pool_size < 1:
        raise ConfigurationError("connect_timeout must be > 0 and pool_size >= 1")
    if socket_timeout is not None and socket_timeout <= 0:
        raise ConfigurationError("socket_timeout must be > 0 (or None)")


__all__ = [
    "COUNT", "CREATE_ATTEMPTS", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_POOL_SIZE",
    "DEFAULT_SOCKET_TIMEOUT", "DEFAULT_TABLE_PREFIX", "LEASE_EXPIRED", "ROWS", "SCHEMA_MISSING",
    "Common", "CommonPlans", "Plan", "PostgresPlans", "Statement", "build_metadata",
    "check_options", "fencing_sequence", "fencing_table", "identity",
    "postgres_plans", "pyformat", "record", "refuse_mismatch", "register_schema_extension",
    "schema_missing", "scope_params", "translate",
]
