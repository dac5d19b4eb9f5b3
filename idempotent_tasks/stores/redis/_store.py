"""RedisStore's primitives: claims, conditional writes, counters and operator actions, each
one script call (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ._client import command, unavailable
from ._maintenance import RedisMaintenance
from ._records import FIELDS, SHARD_DIGITS, Keys, claim_result, record

#: Claims per script call in ``create_many`` (bounds the time one script blocks Redis).
CLAIM_CHUNK: Final = 500


class RedisStore(RedisMaintenance):
    """The store contract on Redis or Redis Cluster (see the package docstring)."""

    # -- claims -------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        """One ``claim.lua`` call (three keys: the hot path).  Only when it finds the record
        expired does a second call, ``claim_many.lua``, re-check and replace it atomically
        together with the counter reset."""
        k = self._keys(scope)
        args = (now, lease_expires_at, self._gc_ms, k.encoded, request_hash)
        try:
            reply = self._eval(self._claim, (k.record, k.processing, k.tokens), args)
            if reply == 2:
                reply = self._eval(self._claim_many, k.claim_keys(), args)
        except self._errors as exc:
            raise unavailable("create", exc, scope) from exc
        return claim_result(scope, reply, request_hash, now, lease_expires_at)

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        """One script call per chunk (standalone) or per shard (Cluster: a script may only
        touch one slot), all sent in one pipeline; each claim stays individually atomic."""
        if not claims:
            return []
        keyed = [(c, self._keys(c.scope)) for c in claims]
        groups = self._claim_groups(keyed)
        calls = [self._claim_call(keyed, g, now, lease_expires_at) for g in groups]
        try:
            replies = self._eval_many(self._claim_many, calls)
        except self._errors as exc:
            raise unavailable("create_many", exc) from exc
        results: list[CreateResult | None] = [None] * len(claims)
        for group, reply in zip(groups, replies, strict=True):
            items = reply if len(group) > 1 else [reply]  # one claim: a bare item
            for i, item in zip(group, items, strict=True):
                c = claims[i]
                results[i] = claim_result(c.scope, item, c.request_hash, now, lease_expires_at)
        return [r for r in results if r is not None]

    def _claim_groups(self, keyed: Sequence[tuple[ClaimRequest, Keys]]) -> list[list[int]]:
        if self._cluster:
            by_shard: dict[str, list[int]] = {}
            for i, (_, k) in enumerate(keyed):
                by_shard.setdefault(k.member[:SHARD_DIGITS], []).append(i)
            groups = list(by_shard.values())
        else:
            groups = [list(range(len(keyed)))]
        return [g[i : i + CLAIM_CHUNK] for g in groups for i in range(0, len(g), CLAIM_CHUNK)]

    def _claim_call(
        self,
        keyed: Sequence[tuple[ClaimRequest, Keys]],
        group: Sequence[int],
        now: float,
        lease: float,
    ) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = [now, lease, self._gc_ms]
        for i in group:
            c, k = keyed[i]
            keys += k.claim_keys()
            args += (k.encoded, c.request_hash)
        return keys, args

    def get(self, scope: Scope) -> StoredRecord | None:
        k = self._keys(scope)
        try:
            v = command(self._conn(), "HMGET", k.record, *FIELDS)
        except self._errors as exc:
            raise unavailable("get", exc, scope) from exc
        if v[0] is None or v[8] != k.encoded:
            return None
        return record(scope, v)

    # -- conditional writes -------------------------------------------------------------
    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        now: float,
        lease_expires_at: float,
    ) -> TakeOver | None:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.counter_index, k.tokens)
        args = (expected_token, now, lease_expires_at, self._gc_ms)
        reply = self._run("take_over", scope, keys, args)
        if not isinstance(reply, list):
            return None
        return TakeOver(int(reply[0]), int(reply[1]))

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        k = self._keys(scope)
        args = (token, now, lease_expires_at, self._gc_ms)
        return bool(self._run("heartbeat", scope, (k.record, k.processing), args))

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, response, now, expires_at, self._gc_ms)
        try:
            return bool(self._eval(self._mark_success, keys, args))
        except self._errors as exc:
            raise unavailable("mark_success", exc, scope) from exc

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        """``mark_success.lua`` once per write, all in one pipeline (each call stays atomic
        and conditional on its own token)."""
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
            return [bool(r) for r in self._eval_many(self._mark_success, calls)]
        except self._errors as exc:
            raise unavailable("mark_success_many", exc) from exc

    def mark_failed(
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
        return bool(self._run("mark_failed", scope, keys, args))

    def release(self, scope: Scope, *, token: int) -> bool:
        k = self._keys(scope)
        return bool(self._run("release", scope, (k.record, k.processing), (token,)))

    def record_failure(
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
        flag = int(only_if_lease_expired)
        args = (token, now, max_retries, expires_at, flag, self._gc_ms)
        reply = self._run("record_failure", scope, keys, args)
        if not isinstance(reply, list):
            return None
        return FailureResult(int(reply[0]), poisoned=bool(reply[1]))

    # -- counters and operator actions --------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        k = self._keys(scope)
        try:
            n = command(self._conn(), "HGET", k.counter, "n")
        except self._errors as exc:
            raise unavailable("get_retry_count", exc, scope) from exc
        return int(n) if n else 0

    def reset_retry_count(self, scope: Scope) -> None:
        k = self._keys(scope)
        self._run("reset_retry_count", scope, (k.counter, k.counter_index), ())

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        k = self._keys(scope)
        keys = (k.record, k.processing, k.finished)
        v = self._run("delete_record", scope, keys, (status.value if status else "",))
        return record(scope, v) if isinstance(v, list) else None
