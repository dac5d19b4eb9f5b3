"""AsyncSQLStore's primitives: the protocol's plans (``stores/sql/protocol.py``), awaited on
the loop through the store's transport."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..effects import Resolution
from ._transaction import AsyncSQLTransactions


class AsyncSQLStore(AsyncSQLTransactions):
    """The durable store on PostgreSQL through asyncpg or psycopg's async connections (see
    the package docstring)."""

    # -- claims -----------------------------------------------------------------------------
    async def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        return await self._execute("create", self._plans.create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at
        ))

    async def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        if not claims:
            return []
        plan = self._plans.create_many(claims, now=now, lease_expires_at=lease_expires_at)
        return await self._execute("create_many", plan)

    async def get(self, scope: Scope) -> StoredRecord | None:
        return await self._execute("get", self._plans.get(scope))

    # -- conditional writes -----------------------------------------------------------------
    async def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        return await self._execute("take_over", self._plans.take_over(
            scope, expected_token=expected_token, now=now, lease_expires_at=lease_expires_at
        ))

    async def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """A settled record of ``expected_token`` to a new attempt (``stores.reopen``)."""
        return await self._execute("reopen", self._plans.reopen(
            scope, expected_token=expected_token, now=now, lease_expires_at=lease_expires_at
        ))

    async def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> bool:
        return await self._execute("heartbeat", self._plans.heartbeat(
            scope, token=token, now=now, lease_expires_at=lease_expires_at
        ))

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        return await self._execute("mark_success", self._plans.mark_success(
            scope, token=token, response=response, now=now, expires_at=expires_at
        ))

    async def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        if not writes:
            return []
        plan = self._plans.mark_success_many(writes, now=now)
        return await self._execute("mark_success_many", plan)

    async def mark_failed(
        self, scope: Scope, *, token: int, now: float, expires_at: float,
        only_if_lease_expired: bool = False, response: bytes | None = None,
    ) -> bool:
        return await self._execute("mark_failed", self._plans.mark_failed(
            scope, token=token, now=now, expires_at=expires_at,
            only_if_lease_expired=only_if_lease_expired, response=response,
        ))

    async def release(self, scope: Scope, *, token: int) -> bool:
        return await self._execute("release", self._plans.release(scope, token=token))

    async def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None:
        return await self._execute("record_failure", self._plans.record_failure(
            scope, token=token, now=now, max_retries=max_retries, expires_at=expires_at,
            only_if_lease_expired=only_if_lease_expired,
        ))

    # -- steps and the UNCERTAIN status (stores.effects) ------------------------------------
    async def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        """The scope's steps on its counter row, fenced by ``token`` (``stores.effects``)."""
        return await self._execute("save_steps", self._plans.save_steps(
            scope, token=token, steps=steps, now=now
        ))

    async def load_steps(self, scope: Scope) -> bytes | None:
        return await self._execute("load_steps", self._plans.load_steps(scope))

    async def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        return await self._execute("mark_uncertain", self._plans.mark_uncertain(
            scope, token=token, now=now, detail=detail
        ))

    async def resolve_uncertain(
        self, scope: Scope, *, resolution: Resolution, now: float,
        response: bytes | None = None, expires_at: float | None = None,
    ) -> bool:
        return await self._execute("resolve_uncertain", self._plans.resolve_uncertain(
            scope, resolution=resolution, now=now, response=response, expires_at=expires_at
        ))

    # -- counters and operator actions ------------------------------------------------------
    async def get_retry_count(self, scope: Scope) -> int:
        return await self._execute("get_retry_count", self._plans.get_retry_count(scope))

    async def reset_retry_count(self, scope: Scope) -> None:
        await self._execute("reset_retry_count", self._plans.reset_retry_count(scope))

    async def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> StoredRecord | None:
        plan = self._plans.delete_record(scope, status=status)
        return await self._execute("delete_record", plan)

    # -- maintenance ------------------------------------------------------------------------
    async def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        return await self._execute("find_stuck", self._plans.find_stuck(
            now=now, heartbeat_before=heartbeat_before, limit=limit
        ))

    async def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        return await self._execute("delete_expired", self._plans.delete_expired(
            now=now, counters_before=counters_before, limit=limit
        ))

    async def list_records(
        self, *, status: Status | None = None, operation: str | None = None,
        tenant: str | None = None, limit: int = 100, offset: int = 0,
    ) -> list[StoredRecord]:
        return await self._execute("list_records", self._plans.list_records(
            status=status, operation=operation, tenant=tenant, limit=limit, offset=offset
        ))

    async def stats(self) -> Mapping[tuple[str, Status], int]:
        return await self._execute("stats", self._plans.stats())

    async def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        return await self._execute("acquire_lock", self._plans.acquire_lock(
            name, owner=owner, now=now, ttl=ttl
        ))

    async def release_lock(self, name: str, *, owner: str) -> None:
        await self._execute("release_lock", self._plans.release_lock(name, owner=owner))


__all__ = ["AsyncSQLStore"]
