"""In-memory store: the reference implementation of the store contract, for tests.

* Guarantee: every primitive is atomic within one process (one ``threading.Lock``);
  nothing survives the process.  Use it in unit tests and in users' own test suites.
* Atomic primitive: the lock around a dict keyed by :class:`Scope`.
* Fencing tokens: one counter for the whole store, advanced under the lock by every claim,
  takeover and reopen, so tokens grow per scope (and overall) and are never reused.
* TTL: nothing expires by itself; ``create`` treats ``expires_at <= now`` as absent and
  ``delete_expired`` purges, exactly like the durable stores.
* Change feed: waiters of a scope are woken in this process (``stores.changes``).
* URL: ``memory://``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.records import (
    CREATED,
    DUPLICATE,
    PROCESSING,
    SUCCESS,
    CreateResult,
    Scope,
    Status,
    StoredRecord,
)
from ._feed import Waiters, scope_digest
from .base import ClaimRequest, FailureResult, SuccessWrite, TakeOver

#: What ``reopen`` may give to a new attempt.
_SETTLED = (Status.SUCCESS, Status.FAILED)


@dataclasses.dataclass(slots=True)
class _Counter:
    count: int
    updated_at: float
    #: The scope's recorded steps (``stores.effects``): they live and die with the counter.
    steps: bytes | None = None


class MemoryStore:
    """Thread-safe in-process store (also exported for users' tests)."""

    name = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[Scope, StoredRecord] = {}
        self._counters: dict[Scope, _Counter] = {}
        self._locks: dict[str, tuple[str, float]] = {}
        self._last_token = 0
        self._waiters = Waiters()

    # -- claims -------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        with self._lock:
            return self._create(scope, request_hash, now, lease_expires_at)

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        with self._lock:
            return [
                self._create(c.scope, c.request_hash, now, lease_expires_at)
                for c in claims
            ]

    def _next_token(self) -> int:
        self._last_token += 1
        return self._last_token

    def _create(
        self, scope: Scope, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        existing = self._records.get(scope)
        if existing is not None:
            if existing.expires_at is None or existing.expires_at > now:
                return CreateResult(DUPLICATE, existing)
            self._counters.pop(scope, None)  # re-created after expiry: a fresh counter
        record = StoredRecord(
            scope, PROCESSING, request_hash, None, self._next_token(), now, now,
            lease_expires_at, None,
        )
        self._records[scope] = record
        return CreateResult(CREATED, record)

    def get(self, scope: Scope) -> StoredRecord | None:
        with self._lock:
            return self._records.get(scope)

    def _owned(self, scope: Scope, token: int) -> StoredRecord | None:
        record = self._records.get(scope)
        if record is None or record.status is not PROCESSING:
            return None
        if record.fencing_token != token:
            return None
        return record

    def _update(self, record: StoredRecord, **changes: Any) -> None:
        """Replace the stored record by a changed copy (records handed out earlier, e.g. in a
        DUPLICATE, never change under their holder)."""
        copy = StoredRecord(
            record.scope, record.status, record.request_hash, record.response,
            record.fencing_token, record.created_at, record.updated_at,
            record.lease_expires_at, record.expires_at,
        )
        for name, value in changes.items():
            setattr(copy, name, value)
        self._records[record.scope] = copy

    def _bump(self, scope: Scope, now: float) -> int:
        counter = self._counters.get(scope)
        if counter is None:
            counter = self._counters[scope] = _Counter(0, now)
        counter.count += 1
        counter.updated_at = now
        return counter.count

    # -- conditional writes -------------------------------------------------------------
    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        now: float,
        lease_expires_at: float,
    ) -> TakeOver | None:
        with self._lock:
            record = self._owned(scope, expected_token)
            if record is None or _lease_live(record, now):
                return None
            token = self._next_token()
            self._update(
                record, fencing_token=token, lease_expires_at=lease_expires_at, updated_at=now
            )
            return TakeOver(self._bump(scope, now), token)

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        with self._lock:
            record = self._records.get(scope)
            if (
                record is None or record.status not in _SETTLED
                or record.fencing_token != expected_token
            ):
                return None  # an UNCERTAIN record waits for an operator, never a new attempt
            token = self._next_token()
            self._records[scope] = StoredRecord(
                scope, Status.PROCESSING, record.request_hash, None, token, now, now,
                lease_expires_at, None,
            )
            self._counters.pop(scope, None)  # a new execution counts afresh
            return token

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        with self._lock:
            record = self._owned(scope, token)
            if record is None:
                return False
            self._update(record, lease_expires_at=lease_expires_at, updated_at=now)
            return True

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        with self._lock:
            record = self._owned(scope, token)
            if record is None:
                return False
            self._records[scope] = StoredRecord(  # a new record: handed-out ones never change
                scope, SUCCESS, record.request_hash, response, token,
                record.created_at, now, None, expires_at,
            )
            return True

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        return [
            self.mark_success(
                w.scope, token=w.token, response=w.response, now=now, expires_at=w.expires_at
            )
            for w in writes
        ]

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
        with self._lock:
            record = self._owned(scope, token)
            if record is None or (only_if_lease_expired and _lease_live(record, now)):
                return False
            self._poison(record, now, expires_at, response)
            return True

    def _poison(
        self, record: StoredRecord, now: float, expires_at: float, response: bytes | None = None
    ) -> None:
        self._update(
            record,
            status=Status.FAILED,
            response=response,
            updated_at=now,
            lease_expires_at=None,
            expires_at=expires_at,
        )

    def release(self, scope: Scope, *, token: int) -> bool:
        with self._lock:
            if self._owned(scope, token) is None:
                return False
            del self._records[scope]
            return True

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
        with self._lock:
            record = self._owned(scope, token)
            if record is None or (only_if_lease_expired and _lease_live(record, now)):
                return None
            count = self._bump(scope, now)
            if count >= max_retries:
                self._poison(record, now, expires_at)
                return FailureResult(count, poisoned=True)
            del self._records[scope]
            return FailureResult(count, poisoned=False)

    # -- steps and the UNCERTAIN status (stores.effects) --------------------------------
    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        with self._lock:
            if self._owned(scope, token) is None:
                return False
            counter = self._counters.get(scope)
            if counter is None:
                counter = self._counters[scope] = _Counter(0, now)
            counter.steps = steps
            return True

    def load_steps(self, scope: Scope) -> bytes | None:
        with self._lock:
            counter = self._counters.get(scope)
            return None if counter is None else counter.steps

    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        with self._lock:
            record = self._owned(scope, token)
            if record is None:
                return False
            self._update(record, status=Status.UNCERTAIN, response=detail, updated_at=now,
                         lease_expires_at=None, expires_at=None)
            return True

    def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: str,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool:
        with self._lock:
            record = self._records.get(scope)
            if record is None or record.status is not Status.UNCERTAIN:
                return False
            if resolution == "retry":
                del self._records[scope]
            elif resolution == "done":
                self._update(record, status=Status.SUCCESS, response=response,
                             updated_at=now, expires_at=expires_at)
            else:
                self._update(record, status=Status.FAILED, updated_at=now, expires_at=expires_at)
            return True

    # -- counters and operator actions --------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        with self._lock:
            counter = self._counters.get(scope)
            return counter.count if counter else 0

    def reset_retry_count(self, scope: Scope) -> None:
        with self._lock:
            self._counters.pop(scope, None)

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        with self._lock:
            record = self._records.get(scope)
            if record is None or (status is not None and record.status is not status):
                return None
            del self._records[scope]
            return record

    # -- maintenance --------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        with self._lock:
            stuck = [
                r
                for r in self._records.values()
                if r.status is Status.PROCESSING
                and not _lease_live(r, now)
                and (heartbeat_before is None or r.updated_at < heartbeat_before)
            ]
        stuck.sort(key=lambda r: r.updated_at)
        return stuck[:limit]

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        with self._lock:
            expired = [
                s
                for s, r in self._records.items()
                if r.expires_at is not None and r.expires_at <= now
            ][:limit]
            for scope in expired:
                del self._records[scope]
            stale = sorted(
                (
                    s
                    for s, c in self._counters.items()
                    if s not in self._records and c.updated_at < counters_before
                ),
                key=lambda s: self._counters[s].updated_at,
            )[:limit]
            for scope in stale:
                del self._counters[scope]
            return len(expired)

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        with self._lock:
            rows = [
                r
                for r in self._records.values()
                if (status is None or r.status is status)
                and (operation is None or r.scope.operation == operation)
                and (tenant is None or r.scope.tenant == tenant)
            ]
        rows.sort(key=lambda r: (r.created_at, r.scope.tenant, r.scope.operation, r.scope.key))
        return rows[offset : offset + limit]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        counts: dict[tuple[str, Status], int] = {}
        with self._lock:
            for r in self._records.values():
                k = (r.scope.operation, r.status)
                counts[k] = counts.get(k, 0) + 1
        return counts

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        with self._lock:
            held = self._locks.get(name)
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self._locks[name] = (owner, now + ttl)
            return True

    def release_lock(self, name: str, *, owner: str) -> None:
        with self._lock:
            held = self._locks.get(name)
            if held is not None and held[0] == owner:
                del self._locks[name]

    # -- change feed (``stores.changes``): in-process waiters ------------------------------
    def announce_change(self, scope: Scope) -> None:
        self._waiters.wake(scope_digest(scope))

    def wait_for_change(self, scope: Scope, *, timeout: float) -> bool:
        return self._waiters.wait(scope_digest(scope), timeout)

    def create_schema(self) -> None:
        """Nothing to create."""

    def close(self) -> None:
        """Nothing to close."""


def _lease_live(record: StoredRecord, now: float) -> bool:
    return record.lease_expires_at is not None and record.lease_expires_at > now
