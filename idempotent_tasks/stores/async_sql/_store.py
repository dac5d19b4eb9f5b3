"""AsyncSQLStore's primitives: SQLStore's PostgreSQL statements, awaited on the loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..._core.errors import StoreUnavailableError
from ..._core.records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..sql import _statements as q
from ._plumbing import one
from ._transaction import AsyncSQLTransactions

if TYPE_CHECKING:
    from ._wire import Wire

#: How often ``create`` re-runs its statement when a concurrent insert was not yet visible.
_CREATE_ATTEMPTS: Final = 50


class AsyncSQLStore(AsyncSQLTransactions):
    """The durable store on PostgreSQL through psycopg's async connections (see the package
    docstring)."""

    # -- claims -----------------------------------------------------------------------------
    async def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        params = q.claim_params(scope, request_hash, now, lease_expires_at)
        return await self._run("create", self._create, scope, params)

    async def _create(self, wire: Wire, scope: Scope, p: Mapping[str, Any]) -> CreateResult:
        ops = self._ops
        for _ in range(_CREATE_ATTEMPTS):
            row = await one(wire, ops._claim_sql, p)
            if row is not None and not row[0]:
                duplicate = q.live_duplicate(scope, row[1:], p["now"])
                if duplicate is not None:
                    return duplicate
                row = await one(wire, ops._create_sql, p)  # expired: replace it atomically
                if row is not None and not row[0]:
                    duplicate = q.live_duplicate(scope, row[1:], p["now"])
                    if duplicate is not None:
                        return duplicate
                    continue
            if row is not None:
                return q.created(scope, p, row[4])
        raise StoreUnavailableError(f"{self.name} store: create kept racing concurrent writers")

    async def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        if not claims:
            return []

        async def run(wire: Wire) -> list[CreateResult]:
            params = q.scope_arrays([c.scope for c in claims])
            params.update(hashes=[c.request_hash for c in claims], now=now, lease=lease_expires_at)
            rows = wire.rows(await wire.execute(self._ops._create_many_sql, params))
            results: list[CreateResult] = []
            for claim, row in zip(claims, rows, strict=True):
                results.append(await self._batch_claim(wire, claim, row, now, lease_expires_at))
            return results

        return await self._run("create_many", run)

    async def _batch_claim(
        self, wire: Wire, claim: ClaimRequest, row: Sequence[Any], now: float, lease: float
    ) -> CreateResult:
        if row[1]:
            record = StoredRecord.claimed(claim.scope, claim.request_hash, int(row[2]), now, lease)
            return CreateResult(CreateOutcome.CREATED, record)
        found = q.live_duplicate(claim.scope, row[3:], now)
        if found is not None:
            return found
        params = q.claim_params(claim.scope, claim.request_hash, now, lease)
        return await self._create(wire, claim.scope, params)

    async def get(self, scope: Scope) -> StoredRecord | None:
        row = await self._one("get", self._common.get, q.scope_params(scope))
        return None if row is None else q.record(scope, row)

    # -- conditional writes -----------------------------------------------------------------
    async def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        p = q.scope_params(scope)
        p.update(token=expected_token, now=now, lease=lease_expires_at)
        row = await self._one("take_over", self._ops._take_over_sql, p)
        return None if row is None else TakeOver(int(row[0]), int(row[1]))

    async def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> bool:
        p = q.scope_params(scope)
        p.update(token=token, now=now, lease=lease_expires_at)
        return await self._rowcount("heartbeat", self._common.heartbeat, p) == 1

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        p = q.scope_params(scope)
        p.update(token=token, response=response, now=now, expires_at=expires_at)
        return await self._rowcount("mark_success", self._common.mark_success, p) == 1

    async def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        if not writes:
            return []
        params = q.scope_arrays([w.scope for w in writes])
        params.update(
            tokens=[w.token for w in writes], responses=[w.response for w in writes],
            expires=[w.expires_at for w in writes], now=now,
        )
        rows = await self._all("mark_success_many", self._ops._mark_success_many_sql, params)
        done = {Scope(*row) for row in rows}
        return [w.scope in done for w in writes]

    async def mark_failed(
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
        return await self._rowcount("mark_failed", sql, p) == 1

    async def release(self, scope: Scope, *, token: int) -> bool:
        p = q.scope_params(scope)
        p["token"] = token
        return await self._rowcount("release", self._common.release, p) == 1

    async def record_failure(
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
        ops = self._ops
        sql = ops._record_failure_expired_sql if only_if_lease_expired else ops._record_failure_sql
        row = await self._one("record_failure", sql, p)
        if row is None:
            return None
        count = int(row[0])
        return FailureResult(count, poisoned=count >= max_retries)

    # -- counters and operator actions ------------------------------------------------------
    async def get_retry_count(self, scope: Scope) -> int:
        row = await self._one("get_retry_count", self._common.get_count, q.scope_params(scope))
        return 0 if row is None else int(row[0])

    async def reset_retry_count(self, scope: Scope) -> None:
        await self._rowcount("reset_retry_count", self._common.reset_count, q.scope_params(scope))

    async def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> StoredRecord | None:
        p = q.scope_params(scope)
        sql = self._common.delete_record
        if status is not None:
            p["status"] = Status(status).value
            sql = self._common.delete_record_status
        row = await self._one("delete_record", sql, p)
        return None if row is None else q.record(scope, row)

    # -- maintenance ------------------------------------------------------------------------
    async def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        p: dict[str, Any] = {"now": now, "limit": limit, "heartbeat_before": heartbeat_before}
        sql = self._common.find_stuck if heartbeat_before is None else self._common.find_stuck_hb
        return [q.scoped_record(row) for row in await self._all("find_stuck", sql, p)]

    async def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        p = {"now": now, "before": counters_before, "limit": limit}

        async def run(wire: Wire) -> int:
            done = await wire.execute(self._ops._delete_records_sql, p)
            await wire.execute(self._ops._delete_counters_sql, p)
            return int(done.command_tuples or 0)

        return await self._run("delete_expired", run)

    async def list_records(
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
        rows = await self._all("list_records", sql, {**used, "limit": limit, "offset": offset})
        return [q.scoped_record(row) for row in rows]

    async def stats(self) -> Mapping[tuple[str, Status], int]:
        rows = await self._all("stats", self._common.stats, None)
        return {(op, q.STATUS[status]): int(n) for op, status, n in rows}

    async def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        p = {"name": name, "owner": owner, "now": now, "expires_at": now + ttl}
        return await self._one("acquire_lock", self._common.acquire_lock, p) is not None

    async def release_lock(self, name: str, *, owner: str) -> None:
        p = {"name": name, "owner": owner}
        await self._rowcount("release_lock", self._common.release_lock, p)


__all__ = ["AsyncSQLStore"]
