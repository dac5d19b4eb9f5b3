"""A stateful model of the store contract (stores/base.py), run against every store.

Hypothesis drives random interleavings of every primitive — claims, conditional writes with
current and stale fencing tokens, reopens of settled records, recovery, cleanup, operator
actions and clock advances — on a few scopes, and after every step compares the store with
:class:`Model`, a small pure-Python statement of the contract written here (not the
MemoryStore, so the MemoryStore is checked too).  On top of the step-by-step comparison, the invariants the guarantee rests on
are asserted on what the store itself returns:

* at most one live owner per scope (probed with no-op heartbeats);
* a SUCCESS record never changes until it has expired and is replaced or purged, or is
  reopened;
* retry counters never decrease, except when an expired record is replaced, a settled one is
  reopened, a stale counter is purged, or an operator resets it;
* ``create`` never answers DUPLICATE with an expired record (it replaces it);
* every new attempt's fencing token (chosen by the store) is greater than every token issued
  for its scope before, and no token is ever issued twice;
* a conditional write with a stale token changes nothing at all.

One store per test run (a fresh PostgreSQL schema per example would dominate the run time);
every example works on the run's own tenant and removes its scopes when it ends.
``HYPOTHESIS_EXAMPLES`` sets the number of examples per store (default 200).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from idempotent_tasks import MemoryStore
from idempotent_tasks._core.records import CreateResult, Scope, Status, StoredRecord
from idempotent_tasks.stores.base import ClaimRequest, FailureResult, Store, TakeOver

from .conftest import STORE_KINDS, drop_store, make_store

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "200"))
STEPS = int(os.environ.get("HYPOTHESIS_MODEL_STEPS", "40"))

START = 1_700_000_000.0
LEASE = 30.0
#: Clock moves: sub-lease, exactly the lease (boundary), past it, and past every expiry.
ADVANCES = (0.5, 1.0, 10.0, 29.0, 30.0, 31.0, 100.0)
#: Record lifetimes after completion; with the advances above they hit ``expires_at == now``.
LIFETIMES = (1.0, 30.0, 100.0)
HASHES = (
    hashlib.sha256(b"a").hexdigest(),
    hashlib.sha256(b"b").hexdigest(),
    "h-\u00e9\n|:{}",  # the contract does not restrict request_hash: bytes != characters
)
KEYS = ("a", "b")
NEVER_ISSUED = 2**62 + 12345
#: What ``reopen`` may give to a new attempt.
SETTLED = (Status.SUCCESS, Status.FAILED)

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- the reference model ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MRecord:
    status: Status
    request_hash: str
    response: bytes | None
    token: int
    created_at: float
    updated_at: float
    lease_expires_at: float | None
    expires_at: float | None

    def live_lease(self, now: float) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at > now

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclasses.dataclass
class MCounter:
    count: int
    updated_at: float


class Model:
    """The store contract of stores/base.py, stated as plainly as possible."""

    def __init__(self) -> None:
        self.records: dict[Scope, MRecord] = {}
        self.counters: dict[Scope, MCounter] = {}

    def owned(self, scope: Scope, token: int) -> MRecord | None:
        rec = self.records.get(scope)
        if rec is None or rec.status is not Status.PROCESSING or rec.token != token:
            return None
        return rec

    def count(self, scope: Scope) -> int:
        counter = self.counters.get(scope)
        return counter.count if counter else 0

    def _bump(self, scope: Scope, now: float) -> int:
        counter = self.counters.setdefault(scope, MCounter(0, now))
        counter.count += 1
        counter.updated_at = now
        return counter.count

    def create(
        self, scope: Scope, request_hash: str, token: int, now: float, lease: float
    ) -> tuple[bool, MRecord, bool]:
        """(created, record, counter_reset)."""
        existing = self.records.get(scope)
        if existing is not None and not existing.expired(now):
            return False, existing, False
        reset = existing is not None and self.counters.pop(scope, None) is not None
        rec = MRecord(Status.PROCESSING, request_hash, None, token, now, now, lease, None)
        self.records[scope] = rec
        return True, rec, reset

    def take_over(self, scope: Scope, expected: int, new: int, now: float, lease: float) -> int | None:
        rec = self.owned(scope, expected)
        if rec is None or rec.live_lease(now):
            return None
        self.records[scope] = dataclasses.replace(
            rec, token=new, lease_expires_at=lease, updated_at=now
        )
        return self._bump(scope, now)

    def reopen(self, scope: Scope, expected: int, new: int, now: float, lease: float) -> bool:
        """stores/reopen.py: a settled record of ``expected`` becomes a new attempt."""
        rec = self.records.get(scope)
        if rec is None or rec.status not in SETTLED or rec.token != expected:
            return False
        self.records[scope] = MRecord(Status.PROCESSING, rec.request_hash, None, new, now, now,
                                      lease, None)
        self.counters.pop(scope, None)
        return True

    def heartbeat(self, scope: Scope, token: int, now: float, lease: float) -> bool:
        rec = self.owned(scope, token)
        if rec is None:
            return False
        self.records[scope] = dataclasses.replace(rec, lease_expires_at=lease, updated_at=now)
        return True

    def mark_success(
        self, scope: Scope, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        rec = self.owned(scope, token)
        if rec is None:
            return False
        self.records[scope] = dataclasses.replace(
            rec, status=Status.SUCCESS, response=response, updated_at=now,
            lease_expires_at=None, expires_at=expires_at,
        )
        return True

    def _poison(self, scope: Scope, rec: MRecord, now: float, expires_at: float) -> None:
        self.records[scope] = dataclasses.replace(
            rec, status=Status.FAILED, updated_at=now, lease_expires_at=None,
            expires_at=expires_at,
        )

    def mark_failed(
        self, scope: Scope, token: int, now: float, expires_at: float, only_expired: bool
    ) -> bool:
        rec = self.owned(scope, token)
        if rec is None or (only_expired and rec.live_lease(now)):
            return False
        self._poison(scope, rec, now, expires_at)
        return True

    def release(self, scope: Scope, token: int) -> bool:
        if self.owned(scope, token) is None:
            return False
        del self.records[scope]
        return True

    def record_failure(
        self, scope: Scope, token: int, now: float, max_retries: int, expires_at: float,
        only_expired: bool,
    ) -> FailureResult | None:
        rec = self.owned(scope, token)
        if rec is None or (only_expired and rec.live_lease(now)):
            return None
        count = self._bump(scope, now)
        if count >= max_retries:
            self._poison(scope, rec, now, expires_at)
            return FailureResult(count, poisoned=True)
        del self.records[scope]
        return FailureResult(count, poisoned=False)

    def stuck(self, now: float, heartbeat_before: float | None) -> dict[Scope, MRecord]:
        return {
            s: r
            for s, r in self.records.items()
            if r.status is Status.PROCESSING
            and not r.live_lease(now)
            and (heartbeat_before is None or r.updated_at < heartbeat_before)
        }

    def expired(self, now: float) -> set[Scope]:
        return {s for s, r in self.records.items() if r.expired(now)}

    def stale_counters(self, before: float) -> set[Scope]:
        """The counters ``delete_expired`` may purge (it purges up to its ``limit`` of them)."""
        return {
            s for s, c in self.counters.items() if s not in self.records and c.updated_at < before
        }


def as_model(rec: StoredRecord) -> MRecord:
    return MRecord(
        rec.status, rec.request_hash, rec.response, rec.fencing_token, rec.created_at,
        rec.updated_at, rec.lease_expires_at, rec.expires_at,
    )


scopes = st.sampled_from(KEYS)
#: 0 is the current owner's token: most writes are by the owner (``fenced_off`` tries every
#: other token on every primitive).
picks = st.one_of(st.just(0), st.just(0), st.just(0), st.integers(min_value=1, max_value=6))
advances = st.sampled_from(ADVANCES)
lifetimes = st.sampled_from(LIFETIMES)
retries = st.integers(min_value=1, max_value=3)


class StoreMachine(RuleBasedStateMachine):
    """Compares one store with :class:`Model` under random interleavings."""

    store: ClassVar[Store]
    #: One tenant for every example of a run (each example removes its scopes when it
    #: ends).  Not one per example: a store picks *which* of several expired records
    #: ``delete_expired(limit=...)`` purges in an order of its own (Redis by the scopes'
    #: shard hashes, which the tenant changes), the model follows that pick, and the rules
    #: enabled next depend on it; a tenant drawn afresh for each example would make
    #: Hypothesis's replay of one example's choices take another path
    #: (``FlakyStrategyDefinition``).
    tenant_name: ClassVar[str] = "model"

    def __init__(self) -> None:
        super().__init__()
        self.tenant = self.tenant_name
        self.scopes = {k: Scope(self.tenant, "op" if k == "a" else "op:2", k) for k in KEYS}
        self.model = Model()
        self.now = START
        self.issued: dict[Scope, list[int]] = {s: [] for s in self.scopes.values()}
        self.last_counts: dict[Scope, int] = dict.fromkeys(self.scopes.values(), 0)
        self.may_decrease: set[Scope] = set()
        self.successes: dict[Scope, StoredRecord] = {}

    # -- helpers ----------------------------------------------------------------------------
    @initialize(keys=st.lists(scopes, unique=True))
    def start(self, keys: list[str]) -> None:
        """Start from fresh scopes, most examples with some of them already claimed."""
        for scope in self.scopes.values():
            assert self.store.get(scope) is None
            assert self.store.get_retry_count(scope) == 0
        for key in keys:
            self.create(key, HASHES[0])

    def teardown(self) -> None:
        for scope in self.scopes.values():
            self.store.delete_record(scope)
            self.store.reset_retry_count(scope)

    def token_for(self, scope: Scope, pick: int) -> int:
        """Candidates, the current owner first (so that shrinking favours valid writes):
        the record's token, this scope's earlier (stale) tokens, another scope's token and
        a token never issued."""
        rec = self.model.records.get(scope)
        candidates = [rec.token] if rec is not None else []
        candidates += [t for t in reversed(self.issued[scope]) if t not in candidates]
        candidates += self.foreign(scope)
        candidates.append(NEVER_ISSUED)
        return candidates[pick % len(candidates)]

    def foreign(self, scope: Scope) -> list[int]:
        """The latest token issued for another scope (tokens are per attempt, not global)."""
        others = [t for s, ts in self.issued.items() if s != scope for t in ts]
        return others[-1:]

    def note_token(self, scope: Scope, token: int) -> None:
        """A token the store just issued: greater than every earlier one of its scope, and
        never issued before to any scope."""
        assert all(token > t for t in self.issued[scope]), (token, self.issued[scope])
        assert all(token not in ts for ts in self.issued.values()), token
        self.issued[scope].append(token)

    def snapshot(self) -> dict[Scope, tuple[StoredRecord | None, int]]:
        return {
            s: (self.store.get(s), self.store.get_retry_count(s)) for s in self.scopes.values()
        }

    def conditional(
        self, scope: Scope, token: int, write: Callable[[], Any], model_write: Callable[[], Any]
    ) -> Any:
        """Run a conditional write; when the model says it must fail, prove that it changed
        nothing anywhere (record and counter of every scope)."""
        expected = model_write() if self.model.owned(scope, token) else None
        if expected is not None:
            got = write()
            assert got == expected, (got, expected)
            return got
        before = self.snapshot()
        got = write()
        assert not got, f"a refused write (token {token}) reported success: {got!r}"
        assert self.snapshot() == before, "a refused conditional write changed the store"
        return got

    def check_create(self, scope: Scope, result: CreateResult, h: str) -> None:
        token = result.record.fencing_token
        created, expected, reset = self.model.create(
            scope, h, token, self.now, self.now + LEASE
        )
        if created:
            self.note_token(scope, token)
        assert result.created is created, (result, expected)
        assert result.record.scope == scope
        assert as_model(result.record) == expected, (result.record, expected)
        if not created:
            exp = result.record.expires_at
            assert exp is None or exp > self.now, "create answered with an expired record"
        if reset:
            self.may_decrease.add(scope)

    # -- claims -----------------------------------------------------------------------------
    @rule(key=scopes, h=st.sampled_from(HASHES))
    def create(self, key: str, h: str) -> None:
        scope = self.scopes[key]
        result = self.store.create(
            scope, request_hash=h, now=self.now, lease_expires_at=self.now + LEASE
        )
        self.check_create(scope, result, h)

    @rule(key=scopes)
    def redeliver(self, key: str) -> None:
        """A duplicate delivery: the same request as the current record's (or the first)."""
        rec = self.model.records.get(self.scopes[key])
        self.create(key, rec.request_hash if rec is not None else HASHES[0])

    @rule(keys=st.lists(scopes, min_size=1, unique=True), h=st.sampled_from(HASHES))
    def create_many(self, keys: list[str], h: str) -> None:
        claims = [ClaimRequest(self.scopes[k], h) for k in keys]
        results = self.store.create_many(claims, now=self.now, lease_expires_at=self.now + LEASE)
        assert len(results) == len(claims)
        for claim, result in zip(claims, results, strict=True):
            self.check_create(claim.scope, result, h)

    # -- conditional writes -----------------------------------------------------------------
    @rule(key=scopes, pick=picks)
    def take_over(self, key: str, pick: int) -> None:
        scope = self.scopes[key]
        expected = self.token_for(scope, pick)
        now, lease = self.now, self.now + LEASE

        def write() -> TakeOver | None:
            return self.store.take_over(
                scope, expected_token=expected, now=now, lease_expires_at=lease
            )

        rec = self.model.owned(scope, expected)
        if rec is None or rec.live_lease(now):  # refused: must change nothing at all
            self.conditional(scope, expected, write, lambda: None)
            return
        got = write()
        assert got is not None, "take_over of an owned, expired lease was refused"
        count = self.model.take_over(scope, expected, got.token, now, lease)
        assert got.retry_count == count, (got, count)
        self.note_token(scope, got.token)

    @rule(key=scopes, pick=picks)
    def reopen(self, key: str, pick: int) -> None:
        """The optional primitive (every built-in store has it): a settled record of the
        expected token only; anything else is refused and changes nothing."""
        scope = self.scopes[key]
        expected = self.token_for(scope, pick)
        now, lease = self.now, self.now + LEASE
        rec = self.model.records.get(scope)
        before = self.snapshot()
        got = self.store.reopen(  # type: ignore[attr-defined]
            scope, expected_token=expected, now=now, lease_expires_at=lease
        )
        if rec is None or rec.status not in SETTLED or rec.token != expected:
            assert got is None, f"reopen of {rec} with token {expected} answered {got}"
            assert self.snapshot() == before, "a refused reopen changed the store"
            return
        assert got is not None, f"reopen of {rec} with its own token was refused"
        self.model.reopen(scope, expected, got, now, lease)
        self.note_token(scope, got)
        self.may_decrease.add(scope)  # a new execution counts afresh
        self.successes.pop(scope, None)  # a SUCCESS record may change by being reopened

    @rule(key=scopes, pick=picks)
    def heartbeat(self, key: str, pick: int) -> None:
        scope = self.scopes[key]
        token = self.token_for(scope, pick)
        now, lease = self.now, self.now + LEASE
        self.conditional(
            scope, token,
            lambda: self.store.heartbeat(scope, token=token, now=now, lease_expires_at=lease),
            lambda: self.model.heartbeat(scope, token, now, lease),
        )

    @rule(key=scopes, pick=picks, response=st.binary(max_size=12), life=lifetimes)
    def mark_success(self, key: str, pick: int, response: bytes, life: float) -> None:
        scope = self.scopes[key]
        token = self.token_for(scope, pick)
        now = self.now
        self.conditional(
            scope, token,
            lambda: self.store.mark_success(
                scope, token=token, response=response, now=now, expires_at=now + life
            ),
            lambda: self.model.mark_success(scope, token, response, now, now + life),
        )

    @rule(key=scopes, pick=picks, life=lifetimes, only_expired=st.booleans())
    def mark_failed(self, key: str, pick: int, life: float, only_expired: bool) -> None:
        scope = self.scopes[key]
        token = self.token_for(scope, pick)
        now = self.now
        self.conditional(
            scope, token,
            lambda: self.store.mark_failed(
                scope, token=token, now=now, expires_at=now + life,
                only_if_lease_expired=only_expired,
            ),
            lambda: self.model.mark_failed(scope, token, now, now + life, only_expired),
        )

    @rule(key=scopes, pick=picks)
    def release(self, key: str, pick: int) -> None:
        scope = self.scopes[key]
        token = self.token_for(scope, pick)
        self.conditional(
            scope, token,
            lambda: self.store.release(scope, token=token),
            lambda: self.model.release(scope, token),
        )

    @rule(key=scopes, pick=picks, max_retries=retries, life=lifetimes, only_expired=st.booleans())
    def record_failure(
        self, key: str, pick: int, max_retries: int, life: float, only_expired: bool
    ) -> None:
        scope = self.scopes[key]
        token = self.token_for(scope, pick)
        now = self.now
        self.conditional(
            scope, token,
            lambda: self.store.record_failure(
                scope, token=token, now=now, max_retries=max_retries, expires_at=now + life,
                only_if_lease_expired=only_expired,
            ),
            lambda: self.model.record_failure(
                scope, token, now, max_retries, now + life, only_expired
            ),
        )

    # -- maintenance ------------------------------------------------------------------------
    def find_stuck(self, heartbeat_before: float | None, limit: int) -> list[StoredRecord]:
        found = self.store.find_stuck(now=self.now, heartbeat_before=heartbeat_before, limit=limit)
        stuck = self.model.stuck(self.now, heartbeat_before)
        assert all(r.scope.tenant == self.tenant for r in found), "another tenant's record"
        assert len(found) == min(limit, len(stuck)), (found, stuck)
        assert len({r.scope for r in found}) == len(found), "a record listed twice"
        for rec in found:
            assert rec.scope in stuck and as_model(rec) == stuck[rec.scope], rec
        times = [r.updated_at for r in found]
        assert times == sorted(times), "find_stuck is not oldest first"
        rest = [r.updated_at for s, r in stuck.items() if s not in {f.scope for f in found}]
        assert not rest or not times or max(times) <= min(rest), "not the oldest ones"
        return found

    def heartbeat_cutoff(self, hb: str, pick: int) -> float | None:
        """None, now, or exactly on / just after some record's last heartbeat (the
        ``updated_at < heartbeat_before`` boundary)."""
        if hb == "none":
            return None
        times = sorted({r.updated_at for r in self.model.records.values()})
        if hb == "now" or not times:
            return self.now
        return times[pick % len(times)] + (0.0 if hb == "at" else 0.5)

    @rule(
        hb=st.sampled_from(("none", "now", "at", "after")),
        pick=picks,
        limit=st.sampled_from((1, 2, 100)),
        max_retries=retries,
    )
    def recover(self, hb: str, pick: int, limit: int, max_retries: int) -> None:
        """What ``recover_stuck_records`` does: find, then count each crashed attempt with
        ``record_failure(only_if_lease_expired=True)``."""
        heartbeat_before = self.heartbeat_cutoff(hb, pick)
        for rec in self.find_stuck(heartbeat_before, limit):
            now = self.now
            got = self.store.record_failure(
                rec.scope, token=rec.fencing_token, now=now, max_retries=max_retries,
                expires_at=now + 100.0, only_if_lease_expired=True,
            )
            expected = self.model.record_failure(
                rec.scope, rec.fencing_token, now, max_retries, now + 100.0, True
            )
            assert got == expected, (got, expected)

    @rule(limit=st.sampled_from((1, 100)), age=st.sampled_from((-1.0, 0.0, 30.0, 100.0)))
    def delete_expired(self, limit: int, age: float) -> None:
        """The store may pick any ``limit`` of the expired records (and of the stale
        counters); which ones it purged is read back, and everything else must be
        untouched."""
        before = self.now - age
        expired = self.model.expired(self.now)
        purged = self.store.delete_expired(now=self.now, counters_before=before, limit=limit)
        assert purged == min(limit, len(expired)), (purged, expired)
        gone = {s for s in expired if self.store.get(s) is None}
        assert len(gone) == purged, (gone, purged)
        for scope in gone:
            del self.model.records[scope]
        stale = self.model.stale_counters(before)
        purged_counters = {s for s in stale if self.store.get_retry_count(s) == 0}
        assert not stale or purged_counters, "no stale counter was purged"
        for scope in purged_counters:
            del self.model.counters[scope]
        self.may_decrease |= purged_counters

    @precondition(lambda self: any(self.issued.values()))
    @rule(key=scopes)
    def probe_owners(self, key: str) -> None:
        """At most one live owner: of every token ever issued for the scope (and a foreign
        one), only the record's own may write, and only while PROCESSING.  The probe is a
        heartbeat that rewrites the current values, so it changes nothing."""
        scope = self.scopes[key]
        before = self.snapshot()
        rec = before[scope][0]
        probes = [*self.issued[scope], NEVER_ISSUED]
        owners = []
        for token in probes:
            now = rec.updated_at if rec is not None else self.now
            lease = rec.lease_expires_at if rec is not None and rec.lease_expires_at else now
            if self.store.heartbeat(scope, token=token, now=now, lease_expires_at=lease):
                owners.append(token)
        assert self.snapshot() == before
        if rec is not None and rec.status is Status.PROCESSING:
            assert owners == [rec.fencing_token], owners
        else:
            assert owners == [], owners

    @rule(key=scopes)
    def fenced_off(self, key: str) -> None:
        """Every conditional write by every token that does not own the scope — stale,
        foreign, never issued, and the record's own token once it is no longer PROCESSING —
        is refused and changes nothing, even with a clock far past every lease."""
        scope = self.scopes[key]
        rec = self.model.records.get(scope)
        tokens = [*self.issued[scope][-3:], *self.foreign(scope), NEVER_ISSUED]
        if rec is not None and rec.status is Status.PROCESSING:
            tokens = [t for t in tokens if t != rec.token]
        before = self.snapshot()
        late = self.now + 10 * LEASE
        for token in dict.fromkeys(tokens):
            attempts = {
                "take_over": self.store.take_over(
                    scope, expected_token=token, now=late,
                    lease_expires_at=late + LEASE,
                ),
                "heartbeat": self.store.heartbeat(
                    scope, token=token, now=late, lease_expires_at=late + LEASE
                ),
                "mark_success": self.store.mark_success(
                    scope, token=token, response=b"stale", now=late, expires_at=late + 1
                ),
                "mark_failed": self.store.mark_failed(
                    scope, token=token, now=late, expires_at=late + 1
                ),
                "record_failure": self.store.record_failure(
                    scope, token=token, now=late, max_retries=1, expires_at=late + 1
                ),
                "release": self.store.release(scope, token=token),
            }
            accepted = {name: got for name, got in attempts.items() if got}
            assert not accepted, f"token {token} is not the owner, yet {accepted} succeeded"
        assert self.snapshot() == before, "a refused conditional write changed the store"

    # -- operator actions -------------------------------------------------------------------
    @rule(key=scopes)
    def unpoison(self, key: str) -> None:
        scope = self.scopes[key]
        rec = self.model.records.get(scope)
        deleted = self.store.delete_record(scope, status=Status.FAILED)
        if rec is None or rec.status is not Status.FAILED:
            assert deleted is None
            return
        assert deleted is not None and as_model(deleted) == rec
        del self.model.records[scope]
        self.store.reset_retry_count(scope)
        self.model.counters.pop(scope, None)
        self.may_decrease.add(scope)

    # -- time -------------------------------------------------------------------------------
    @rule(seconds=advances)
    def advance(self, seconds: float) -> None:
        self.now += seconds

    def deadlines(self, edge: str) -> list[float]:
        records = self.model.records.values()
        times = [r.lease_expires_at if edge == "lease" else r.expires_at for r in records]
        return sorted(t for t in times if t is not None and t > self.now)

    @precondition(lambda self: self.deadlines("lease") or self.deadlines("expiry"))
    @rule(edge=st.sampled_from(("lease", "expiry")), offset=st.sampled_from((0.0, -0.5, 0.5)))
    def advance_to_deadline(self, edge: str, offset: float) -> None:
        """Land just before, exactly on, or just after the next lease or record expiry: the
        boundaries (``lease_expires_at <= now`` is expired, so is ``expires_at <= now``)."""
        upcoming = self.deadlines(edge) or self.deadlines("lease") or self.deadlines("expiry")
        self.now = max(self.now, upcoming[0] + offset)

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def store_matches_model(self) -> None:
        for scope, (stored, count) in self.snapshot().items():
            expected = self.model.records.get(scope)
            got = None if stored is None else as_model(stored)
            assert got == expected, f"{scope.key}: store {got} != model {expected}"
            assert stored is None or stored.scope == scope
            assert count == self.model.count(scope), (scope.key, count, self.model.count(scope))
            self.check_counter_monotonic(scope, count)
            self.check_success_frozen(scope, stored)
        self.may_decrease.clear()

    def check_counter_monotonic(self, scope: Scope, count: int) -> None:
        if count < self.last_counts[scope]:
            assert scope in self.may_decrease, f"{scope.key}: counter went down"
        self.last_counts[scope] = count

    def check_success_frozen(self, scope: Scope, stored: StoredRecord | None) -> None:
        seen = self.successes.get(scope)
        if seen is not None and stored != seen:
            assert seen.expires_at is not None and seen.expires_at <= self.now, (
                f"{scope.key}: a live SUCCESS record changed: {seen} -> {stored}"
            )
            self.successes.pop(scope)
        if stored is not None and stored.status is Status.SUCCESS:
            self.successes[scope] = stored


#: moto's DynamoDB server answers a request in ~4 ms (PostgreSQL in ~0.1 ms) and an example
#: makes ~700 of them: that run gets an eighth of the examples (~70 s instead of ~9 min).
KIND_SETTINGS = {"dynamodb": settings(SETTINGS, max_examples=max(10, EXAMPLES // 8))}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_store_matches_model(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    machine = type(f"StoreMachine_{kind}", (StoreMachine,),
                   {"store": store, "tenant_name": f"model-{uuid.uuid4().hex[:12]}"})
    try:
        run_state_machine_as_test(machine, settings=KIND_SETTINGS.get(kind, SETTINGS))
    finally:
        drop_store(store)


# -- the model can fail ---------------------------------------------------------------------------
class _TakeOverIgnoresLease(MemoryStore):
    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float,
    ) -> TakeOver | None:
        return super().take_over(
            scope, expected_token=expected_token, now=now + 10 * LEASE,
            lease_expires_at=lease_expires_at,
        )


class _HeartbeatIgnoresToken(MemoryStore):
    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        rec = self.get(scope)
        owner = rec.fencing_token if rec is not None else token
        return super().heartbeat(scope, token=owner, now=now, lease_expires_at=lease_expires_at)


class _ReusesTokens(MemoryStore):
    """Issues the same token to every attempt: a stale owner could write over a newer one."""

    def _next_token(self) -> int:
        return 7


class _KeepsCounter(MemoryStore):
    """Puts back the counter a call reset (the breakages below)."""

    def _keeping_counter(self, scope: Scope, now: float, call: Callable[[], Any]) -> Any:
        count = self.get_retry_count(scope)
        result = call()
        for _ in range(count - self.get_retry_count(scope)):
            self._bump(scope, now)
        return result


class _KeepsCounterOnReplace(_KeepsCounter):
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        create = super().create
        result: CreateResult = self._keeping_counter(scope, now, lambda: create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at))
        return result


class _ReopenKeepsCounter(_KeepsCounter):
    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float,
    ) -> int | None:
        reopen = super().reopen
        token: int | None = self._keeping_counter(scope, now, lambda: reopen(
            scope, expected_token=expected_token, now=now, lease_expires_at=lease_expires_at))
        return token


@pytest.mark.parametrize(
    "broken",
    [_TakeOverIgnoresLease, _HeartbeatIgnoresToken, _KeepsCounterOnReplace, _ReusesTokens,
     _ReopenKeepsCounter],
)
def test_the_model_catches_a_broken_store(broken: type[MemoryStore]) -> None:
    """The harness itself can fail: deliberately broken stores are caught (derandomized, so
    this is deterministic)."""
    machine = type(f"Broken_{broken.__name__}", (StoreMachine,), {"store": broken()})
    strict = settings(SETTINGS, max_examples=1000, derandomize=True, database=None,
                      phases=[Phase.generate], print_blob=False)
    with pytest.raises((AssertionError, BaseExceptionGroup)):
        run_state_machine_as_test(machine, settings=strict)


# -- found by the model, pinned down ------------------------------------------------------------
def test_cleanup_purges_a_counter_once_its_record_is_gone(store: Store) -> None:
    """base.py: ``delete_expired`` purges "counters whose scope has no record and whose last
    change is older than ``counters_before``".  A cleanup that ran while the scope still had
    a record must not postpone that: otherwise the counter outlives the record it belonged
    to, and a scope re-created later (docs/design.md: "starts with a fresh counter") inherits
    old failures and is poisoned early."""
    s = Scope("t", "op", "k")
    n = START
    first = store.create(s, request_hash="h", now=n, lease_expires_at=n + LEASE)
    assert first.created
    failure = store.record_failure(
        s, token=first.record.fencing_token, now=n, max_retries=3, expires_at=n + 100
    )
    assert failure == FailureResult(1, poisoned=False)  # released; counter 1, changed at n
    second = store.create(s, request_hash="h", now=n + 10, lease_expires_at=n + 40)
    assert second.created
    # a cleanup while the scope has a record: its counter is old, but must stay
    assert store.delete_expired(now=n + 20, counters_before=n + 20, limit=100) == 0
    assert store.get_retry_count(s) == 1
    assert store.release(s, token=second.record.fencing_token)
    # no record now, and the counter's last change (n) is older than counters_before
    assert store.delete_expired(now=n + 30, counters_before=n + 15, limit=100) == 0
    assert store.get_retry_count(s) == 0, "a stale counter without a record was not purged"
