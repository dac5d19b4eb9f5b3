"""The Redis protocol: for each primitive of the store contract, which script runs with which
keys and arguments, and what its reply means — the one copy :class:`RedisStore` and
:class:`AsyncRedisStore` share (each is this protocol and a transport).

Every method returns a plan (see ``_scripts``): a generator that yields commands and is sent
their replies; nothing here talks to a driver or awaits.  Key layout and reply parsing are in
``_records``, maintenance plans in ``_maintenance``, ``WAIT`` for replicas in
``_replication``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from ..._core.errors import ConfigurationError
from ..._core.records import CreateResult, Scope, Status, StoredRecord
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..effects import Resolution
from ._maintenance import MaintenancePlans
from ._records import FIELDS, SHARD_DIGITS, Keys, claim_result, record
from ._replication import ReplicaWaits
from ._scripts import Plan, Step, checked

#: Claims (or writes) per script call in ``create_many`` and ``mark_success_many`` (bounds
#: the time one script blocks Redis).
CLAIM_CHUNK: Final = 500


class RedisProtocol(MaintenancePlans):
    """The plans of every store primitive (see the package docstring for what they
    guarantee)."""

    #: The key names of the last ``create_many``'s scopes, for the ``mark_success_many``
    #: that usually follows with the same scopes (for speed: a scope's key names cost a
    #: SHA-256 and five strings).  Replaced whole, never changed in place: a thread reads
    #: one batch's names or another's, and a scope not found is named afresh.
    _claimed_keys: Mapping[Scope, Keys] = MappingProxyType({})

    @classmethod
    def on(
        cls, transport: Any, prefix: str, *, gc_ttl: float, wait_replicas: int, wait_timeout: float
    ) -> RedisProtocol:
        """The protocol for a transport (which says whether it talks to a Cluster, and which
        exceptions its driver raises)."""
        if wait_replicas and transport.cluster:
            raise ConfigurationError(
                "wait_replicas is not supported on Redis Cluster (WAIT is per node); see "
                "docs/redis.md"
            )
        return cls(
            prefix, gc_ttl=gc_ttl, cluster=transport.cluster, noscript=transport.noscript,
            errors=transport.errors,
            waits=ReplicaWaits(wait_replicas, wait_timeout) if wait_replicas else None,
        )

    # -- claims -------------------------------------------------------------------------
    def create(
        self, scope: Scope, request_hash: str, now: float, lease_expires_at: float
    ) -> Plan[CreateResult]:
        """One ``claim.lua`` call (three keys: the hot path).  Only when it finds the record
        expired does a second call, ``claim_many.lua``, re-check and replace it atomically
        together with the counter reset."""
        k = Keys(scope, self.shards)
        args = (now, lease_expires_at, self.gc_ms, k.encoded, request_hash)
        # the hot path: eval's body inlined (one flat step; the command built in place)
        step: Step = (
            ("EVALSHA", self.shas["claim"], 3, k.record, k.processing, k.tokens, *args)
            if self.waits is None
            else self.script("claim", (k.record, k.processing, k.tokens), args)
        )
        reply = yield step
        if type(step) is not tuple or isinstance(reply, BaseException):
            reply = yield from self.settle("claim", step, reply)
        if reply == 2:
            reply = yield from self.eval("claim_many", k.claim_keys(), args)
        return claim_result(scope, reply, request_hash, now, lease_expires_at)

    def create_many(
        self, claims: Sequence[ClaimRequest], now: float, lease_expires_at: float
    ) -> Plan[list[CreateResult]]:
        """One script call per chunk (standalone) or per shard (Cluster: a script may only
        touch one slot), all sent in one pipeline; each claim stays individually atomic."""
        if not claims:
            return []
        keyed = [(c, Keys(c.scope, self.shards)) for c in claims]
        if len(keyed) <= CLAIM_CHUNK:  # bounded: one script call's worth
            self._claimed_keys = {c.scope: k for c, k in keyed}
        groups = self._groups([k for _, k in keyed])
        calls = [self._claim_call(keyed, g, now, lease_expires_at) for g in groups]
        replies = yield from self.eval_many("claim_many", calls)
        results: list[CreateResult | None] = [None] * len(claims)
        for group, reply in zip(groups, replies, strict=True):
            items = reply if len(group) > 1 else [reply]  # one claim: a bare item
            for i, item in zip(group, items, strict=True):
                c = claims[i]
                results[i] = claim_result(c.scope, item, c.request_hash, now, lease_expires_at)
        return [r for r in results if r is not None]

    def _groups(self, keys: Sequence[Keys]) -> list[list[int]]:
        """Positions of ``keys`` per script call of a batch: chunks of ``CLAIM_CHUNK``, and
        on a Cluster one shard per call (a script may only touch one slot)."""
        if self.cluster:
            by_shard: dict[str, list[int]] = {}
            for i, k in enumerate(keys):
                by_shard.setdefault(k.member[:SHARD_DIGITS], []).append(i)
            groups = list(by_shard.values())
        else:
            groups = [list(range(len(keys)))]
        return [g[i : i + CLAIM_CHUNK] for g in groups for i in range(0, len(g), CLAIM_CHUNK)]

    def _claim_call(
        self,
        keyed: Sequence[tuple[ClaimRequest, Keys]],
        group: Sequence[int],
        now: float,
        lease: float,
    ) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = [now, lease, self.gc_ms]
        for i in group:
            c, k = keyed[i]
            keys += k.claim_keys()
            args += (k.encoded, c.request_hash)
        return keys, args

    def get(self, scope: Scope) -> Plan[StoredRecord | None]:
        k = Keys(scope, self.shards)
        v = checked((yield ("HMGET", k.record, *FIELDS)))
        if v[0] is None or v[8] != k.encoded:
            return None
        return record(scope, v)

    # -- conditional writes -------------------------------------------------------------
    def take_over(
        self, scope: Scope, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[TakeOver | None]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.processing, k.counter_index, k.tokens)
        args = (expected_token, now, lease_expires_at, self.gc_ms)
        reply = yield from self.eval("take_over", keys, args)
        if not isinstance(reply, list):
            return None
        return TakeOver(int(reply[0]), int(reply[1]))

    def reopen(
        self, scope: Scope, expected_token: int, now: float, lease_expires_at: float
    ) -> Plan[int | None]:
        """One ``reopen.lua`` call: the record, both indexes and the counter reset at once."""
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.processing, k.finished, k.counter_index, k.tokens)
        reply = yield from self.eval("reopen", keys, (expected_token, now, lease_expires_at,
                                                      self.gc_ms))
        return int(reply[0]) if isinstance(reply, list) else None

    def heartbeat(
        self, scope: Scope, token: int, now: float, lease_expires_at: float
    ) -> Plan[bool]:
        k = Keys(scope, self.shards)
        args = (token, now, lease_expires_at, self.gc_ms)
        return bool((yield from self.eval("heartbeat", (k.record, k.processing), args)))

    def mark_success(
        self, scope: Scope, token: int, response: bytes, now: float, expires_at: float
    ) -> Plan[bool]:
        k = Keys(scope, self.shards)
        args = (token, response, now, expires_at, self.gc_ms)
        # the hot path: eval's body inlined (one flat step; the command built in place)
        step: Step = (
            ("EVALSHA", self.shas["mark_success"], 4, k.record, k.counter, k.processing,
             k.finished, *args)
            if self.waits is None
            else self.script("mark_success", (k.record, k.counter, k.processing, k.finished), args)
        )
        reply = yield step
        if type(step) is not tuple or isinstance(reply, BaseException):
            reply = yield from self.settle("mark_success", step, reply)
        return bool(reply)

    def mark_success_many(self, writes: Sequence[SuccessWrite], now: float) -> Plan[list[bool]]:
        """``mark_success_many.lua`` once per chunk (standalone) or per shard (Cluster), all
        sent in one pipeline; each write stays individually atomic and conditional on its
        own token.  One script call for a batch, not one per write: the server dispatches
        one script and the client packs one command and reads one reply (for speed)."""
        if not writes:
            return []
        known, shards = self._claimed_keys, self.shards
        keys = [known.get(w.scope) or Keys(w.scope, shards) for w in writes]
        groups = self._groups(keys)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for group in groups:
            names: list[str] = []
            args: list[Any] = [now, self.gc_ms]
            for i in group:
                k, w = keys[i], writes[i]
                names += (k.record, k.counter, k.processing, k.finished)
                args += (w.token, w.response, w.expires_at)
            calls.append((names, args))
        replies = yield from self.eval_many("mark_success_many", calls)
        written = [False] * len(writes)
        for group, reply in zip(groups, replies, strict=True):
            for i, item in zip(group, reply, strict=True):
                written[i] = item == 1
        return written

    def mark_failed(
        self,
        scope: Scope,
        token: int,
        now: float,
        expires_at: float,
        only_if_lease_expired: bool,
        response: bytes | None,
    ) -> Plan[bool]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, now, expires_at, int(only_if_lease_expired), self.gc_ms, response or b"")
        return bool((yield from self.eval("mark_failed", keys, args)))

    def release(self, scope: Scope, token: int) -> Plan[bool]:
        k = Keys(scope, self.shards)
        return bool((yield from self.eval("release", (k.record, k.processing), (token,))))

    def record_failure(
        self,
        scope: Scope,
        token: int,
        now: float,
        max_retries: int,
        expires_at: float,
        only_if_lease_expired: bool,
    ) -> Plan[FailureResult | None]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.processing, k.finished, k.counter_index)
        args = (token, now, max_retries, expires_at, int(only_if_lease_expired), self.gc_ms)
        reply = yield from self.eval("record_failure", keys, args)
        if not isinstance(reply, list):
            return None
        return FailureResult(int(reply[0]), poisoned=bool(reply[1]))

    # -- steps and the UNCERTAIN status (stores.effects) --------------------------------
    def save_steps(self, scope: Scope, token: int, steps: bytes, now: float) -> Plan[bool]:
        """One ``save_steps.lua`` call: the blob goes into the counter, fenced by the record."""
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.counter_index)
        return bool((yield from self.eval("save_steps", keys, (token, steps, now, self.gc_ms))))

    def load_steps(self, scope: Scope) -> Plan[bytes | None]:
        k = Keys(scope, self.shards)
        steps: bytes | None = checked((yield ("HGET", k.counter, "s")))
        return steps

    def mark_uncertain(
        self, scope: Scope, token: int, now: float, detail: bytes | None
    ) -> Plan[bool]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.processing, k.finished)
        return bool((yield from self.eval("mark_uncertain", keys, (token, now, detail or b""))))

    def resolve_uncertain(
        self,
        scope: Scope,
        resolution: Resolution,
        now: float,
        response: bytes | None,
        expires_at: float | None,
    ) -> Plan[bool]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.counter, k.finished)
        args = (resolution, now, response or b"", "" if expires_at is None else expires_at,
                self.gc_ms)
        return bool((yield from self.eval("resolve_uncertain", keys, args)))

    # -- counters and operator actions --------------------------------------------------
    def get_retry_count(self, scope: Scope) -> Plan[int]:
        k = Keys(scope, self.shards)
        n = checked((yield ("HGET", k.counter, "n")))
        return int(n) if n else 0

    def reset_retry_count(self, scope: Scope) -> Plan[None]:
        k = Keys(scope, self.shards)
        yield from self.eval("reset_retry_count", (k.counter, k.counter_index), ())

    def delete_record(self, scope: Scope, status: Status | None) -> Plan[StoredRecord | None]:
        k = Keys(scope, self.shards)
        keys = (k.record, k.processing, k.finished)
        v = yield from self.eval("delete_record", keys, (status.value if status else "",))
        return record(scope, v) if isinstance(v, list) else None
