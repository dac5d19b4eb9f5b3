"""AsyncRedisStore's primitives: RedisStore's scripts and replies, awaited on the loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..redis._client import unavailable
from ..redis._records import FIELDS, Keys, claim_result, record
from ..redis._store import CLAIM_CHUNK
from ._maintenance import AsyncRedisMaintenance


class AsyncRedisStore(AsyncRedisMaintenance):
    """The store contract on Redis through ``redis.asyncio`` (see the package docstring)."""

    # -- claims -------------------------------------------------------------------------
    async def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        """One ``claim.lua`` call; only when it finds the record expired does a second call,
        ``claim_many.lua``, re-check and replace it atomically with the counter reset."""
        k = self._keys(scope)
        args = (now, lease_expires_at, self._gc_ms, k.encoded, request_hash)
        try:
            reply = await self._eval("claim", (k.record, k.processing, k.tokens), args)
            if reply == 2:
                reply = await self._eval("claim_many", k.claim_keys(), args)
        except self._errors as exc:
            raise unavailable("create", exc, scope) from exc
        return claim_result(scope, reply, request_hash, now, lease_expires_at)

    async def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        """One ``claim_many.lua`` call per chunk of claims, all in one pipeline."""
        if not claims:
            return []
        keyed = [(c, self._keys(c.scope)) for c in claims]
        groups = [
            list(range(i, min(i + CLAIM_CHUNK, len(keyed))))
            for i in range(0, len(keyed), CLAIM_CHUNK)
        ]
        calls = [_claim_call(keyed, g, now, lease_expires_at, self._gc_ms) for g in groups]
        try:
            replies = await self._eval_many("claim_many", calls)
        except self._errors as exc:
            raise unavailable("create_many", exc) from exc
        results: list[CreateResult] = []
        for group, reply in zip(groups, replies, strict=True):
            items = reply if len(group) > 1 else [reply]  # one claim: a bare item
            for i, item in zip(group, items, strict=True):
                c = claims[i]
                results.append(
                    claim_result(c.scope, item, c.request_hash, now, lease_expires_at)
                )
        return results

    async def get(self, scope: Scope) -> StoredRecord | None:
        k = self._keys(scope)
        try:
            v = await self._command("HMGET", k.record, *FIELDS)
        except self._errors as exc:
            raise unavailable("get", exc, scope) from exc
        if v[0] is None or v[8] != k.encoded:
            return None
        return record(scope, v)

    # -- conditional writes -------------------------------------------------------------
    async def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.counter_index, k.tokens)
        args = (expected_token, now, lease_expires_at, self._gc_ms)
        reply = await self._run("take_over", scope, keys, args)
        if not isinstance(reply, list):
            return None
        return TakeOver(int(reply[0]), int(reply[1]))

    async def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> bool:
        k = self._keys(scope)
        args = (token, now, lease_expires_at, self._gc_ms)
        return bool(await self._run("heartbeat", scope, (k.record, k.processing), args))

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, response, now, expires_at, self._gc_ms)
        return bool(await self._run("mark_success", scope, keys, args))

    async def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        """``mark_success.lua`` once per write, all in one pipeline (each stays conditional
        on its own token)."""
        if not writes:
            return []
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for w in writes:
            k = self._keys(w.scope)
            calls.append((
                (k.record, k.counter, k.processing, k.finished),
                (w.token, w.response, now, w.expires_at, self._gc_ms),
            ))
        try:
            return [bool(r) for r in await self._eval_many("mark_success", calls)]
        except self._errors as exc:
            raise unavailable("mark_success_many", exc) from exc

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
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, now, expires_at, int(only_if_lease_expired), self._gc_ms, response or b"")
        return bool(await self._run("mark_failed", scope, keys, args))

    async def release(self, scope: Scope, *, token: int) -> bool:
        k = self._keys(scope)
        return bool(await self._run("release", scope, (k.record, k.processing), (token,)))

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
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished, k.counter_index)
        args = (token, now, max_retries, expires_at, int(only_if_lease_expired), self._gc_ms)
        reply = await self._run("record_failure", scope, keys, args)
        if not isinstance(reply, list):
            return None
        return FailureResult(int(reply[0]), poisoned=bool(reply[1]))

    # -- counters and operator actions --------------------------------------------------
    async def get_retry_count(self, scope: Scope) -> int:
        k = self._keys(scope)
        try:
            n = await self._command("HGET", k.counter, "n")
        except self._errors as exc:
            raise unavailable("get_retry_count", exc, scope) from exc
        return int(n) if n else 0

    async def reset_retry_count(self, scope: Scope) -> None:
        k = self._keys(scope)
        await self._run("reset_retry_count", scope, (k.counter, k.counter_index), ())

    async def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> StoredRecord | None:
        k = self._keys(scope)
        keys = (k.record, k.processing, k.finished)
        v = await self._run("delete_record", scope, keys, (status.value if status else "",))
        return record(scope, v) if isinstance(v, list) else None


def _claim_call(
    keyed: Sequence[tuple[ClaimRequest, Keys]],
    group: Sequence[int],
    now: float,
    lease: float,
    gc_ms: bytes,
) -> tuple[list[str], list[Any]]:
    keys: list[str] = []
    args: list[Any] = [now, lease, gc_ms]
    for i in group:
        c, k = keyed[i]
        keys += k.claim_keys()
        args += (k.encoded, c.request_hash)
    return keys, args


__all__ = ["AsyncRedisStore"]
