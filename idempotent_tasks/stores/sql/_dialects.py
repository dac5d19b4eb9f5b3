"""The sync transport's side of the protocol: driving a plan on a DBAPI cursor, and the
plans of the sync-only dialects (SQLite, MySQL/MariaDB).

SQLite's and MySQL's multi-statement primitives are short transactions with locks and
retries of their own (``BEGIN IMMEDIATE``, deadlock victims run again): their plans hand the
cursor to those functions as one step (a callable the driver calls with the cursor) instead
of yielding statements.  They never run on an async transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ._mysql import MySQLCommon, MySQLOps
from ._plans import ROWS, CommonPlans, Plan, PostgresPlans
from ._schema import build_metadata
from ._sqlite import SQLiteOps
from ._statements import (
    Common,
    claim_params,
    failure_params,
    identity,
    scope_params,
    take_over_params,
)

_T = TypeVar("_T")


def drive(cursor: Any, plan: Plan[_T]) -> _T:
    """Run ``plan`` on a DBAPI cursor: each statement executed, its rows (or rowcount)
    sent back; a callable step is called with the cursor."""
    answer = None
    try:
        while True:
            step = plan.send(answer)
            if type(step) is tuple:
                sql, params, fetch = step
                cursor.execute(sql, params)
                answer = cursor.fetchall() if fetch == ROWS else cursor.rowcount
            else:
                answer = step(cursor)
    except StopIteration as done:
        result: _T = done.value
        return result


class CursorPlans(CommonPlans):
    """SQLite's (and, through :class:`MySQLPlans`, MySQL's) plans."""

    def __init__(self, name: str, common: Common, ops: SQLiteOps | MySQLOps) -> None:
        super().__init__(name, common)
        self.ops = ops

    def _call(self, fn: Callable[[Any], Any]) -> Plan[Any]:
        return (yield fn)

    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> Plan[CreateResult]:
        """The claim as one step, flat for speed (no claim-loop generator on every
        delivery); a claim whose step answers None (MySQL's, after a racing delete) goes to
        :meth:`CommonPlans.create`'s loop."""
        p = claim_params(scope, request_hash, now, lease_expires_at)
        ops = self.ops
        claimed: CreateResult | None = yield lambda cur: ops.create(cur, scope, p)
        if claimed is not None:
            return claimed
        return (yield from super().create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at
        ))

    def _claim(self, scope: Scope, p: Mapping[str, Any]) -> Plan[CreateResult | None]:
        ops = self.ops  # the step yielded directly: no generator of ``_call`` per claim
        claimed: CreateResult | None = yield lambda cur: ops.create(cur, scope, p)
        return claimed

    def _claim_many(
        self, claims: Sequence[ClaimRequest], now: float, lease: float
    ) -> Plan[list[CreateResult | None]]:
        return self._call(lambda cur: self.ops.create_many(cur, claims, now, lease))

    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[TakeOver | None]:
        p = take_over_params(scope, expected_token, now, lease_expires_at)
        return self._call(lambda cur: self.ops.take_over(cur, p))

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[int | None]:
        p = take_over_params(scope, expected_token, now, lease_expires_at)
        return self._call(lambda cur: self.ops.reopen(cur, p))

    def mark_success_many(
        self, writes: Sequence[SuccessWrite], *, now: float
    ) -> Plan[list[bool]]:
        return self._call(lambda cur: self.ops.mark_success_many(cur, writes, now))

    def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> Plan[FailureResult | None]:
        p = failure_params(scope, token, now, max_retries, expires_at)
        return self._call(lambda cur: self.ops.record_failure(cur, p, only_if_lease_expired))

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> Plan[int]:
        p = {"now": now, "before": counters_before, "limit": limit}
        return self._call(lambda cur: self.ops.delete_expired(cur, p))


class MySQLPlans(CursorPlans):
    """MySQL has no ``DELETE … RETURNING`` and no ``ON CONFLICT … WHERE``: those two
    primitives are short transactions too."""

    ops: MySQLOps

    def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> Plan[StoredRecord | None]:
        p = scope_params(scope)
        if status is not None:
            p["status"] = Status(status).value
        ops = self.ops
        return self._call(lambda cur: ops.delete_record(cur, scope, p))

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> Plan[bool]:
        p = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
        ops = self.ops
        return self._call(lambda cur: ops.acquire_lock(cur, p))


def dialect_plans(
    name: str, quote: Callable[[str], str], prefix: str,
    operational_error: type[BaseException] = Exception,
) -> CommonPlans:
    """The plans of ``name`` (``"postgresql"``, ``"sqlite"`` or ``"mysql"``) for the tables
    of ``prefix``, with ``quote`` the dialect's identifier quoting (MySQL's plans retry a
    deadlock victim: ``operational_error`` is its driver's ``OperationalError``)."""
    r, c, lk = (quote(f"{prefix}_{t}") for t in ("records", "retry_counters", "locks"))
    if name == "postgresql":
        return PostgresPlans(r, c, lk, quote(f"{prefix}_fencing_seq"))
    return cursor_plans(name, r, c, lk, quote(f"{prefix}_fencing"), operational_error)


def schema_objects(quote: Callable[[str], str], prefix: str) -> tuple[str, ...]:
    """The quoted names of the store's tables (every table of :func:`build_metadata`): what
    :func:`check_schema` probes.  The token source (PostgreSQL's sequence, SQLite's fencing
    table) is not among them: only a claim uses it, and a claim without it fails before any
    body runs; a database of an earlier version, which lacks it, can still be read until
    ``create_schema`` adds it."""
    return tuple(quote(name) for name in build_metadata(prefix).tables)


def check_schema(objects: tuple[str, ...]) -> Plan[None]:
    """One empty ``SELECT`` from each of ``objects``: every table checked on a store's
    first use, so a partly missing one (a table dropped, a migration half applied) is a
    ``CONFIGURATION_ERROR`` naming the table (the driver's "no such table") before any claim
    is taken and any body runs — not a failure after the body, when its outcome cannot be
    recorded."""
    for name in objects:
        yield (f"SELECT 1 FROM {name} WHERE 1 = 0", {}, ROWS)


def cursor_plans(
    name: str, r: str, c: str, lk: str, fencing: str, operational_error: type[BaseException]
) -> CursorPlans:
    """SQLite's or MySQL's plans, on the quoted table names."""
    if name == "mysql":
        mysql = MySQLCommon(r, c, lk)
        return MySQLPlans(name, mysql, MySQLOps(r, c, mysql, operational_error))
    common = Common(r, c, lk, identity)
    return CursorPlans(name, common, SQLiteOps(r, c, fencing, common))


__all__ = [
    "CursorPlans", "MySQLPlans", "check_schema", "cursor_plans", "dialect_plans", "drive",
    "schema_objects",
]
