"""Unique enqueue: a pending-message mark per scope, claimed by producers, released by workers.

"Don't queue the same report twice while one is pending" needs a claim *before* the publish,
and one that a crash cannot leave behind.  The mark is an ordinary record of the handler's
store, in a scope of its own: (tenant, ``"enqueue:" + operation``, key).  So it gets the
store's guarantees for free:

* **one winner** — the producer claims it with the store's atomic ``create``: of any number of
  concurrent producers exactly one publishes; the others read the holder's fencing token in
  the same round trip and rebuild the pending message's handle from it (the message id is
  derived from the mark's scope and token, :attr:`UniqueMark.message_id`).
* **a lease, not a lock** — a producer killed between the mark and the publish, or a worker
  killed before it released the mark, blocks the scope only until the lease expires; the next
  producer then takes the mark over (a new token) and publishes.  A mark poisoned or settled
  by the recovery job (it looks like a stuck record once its lease expired) is deleted and
  claimed again.
* **owner-checked release** — the worker releases with the message's token (the store's
  conditional ``release``): a stale worker whose mark was taken over cannot release the
  newer mark.

The handler's ``acquire_unique`` / ``release_unique`` (and ``_async`` twins) run the two
flows below; the Celery, Dramatiq and taskiq ``enqueue_unique`` call only those.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ..typing import Seconds, seconds
from .admin import Maintenance
from .commands import Command
from .drivers import drive_async
from .engine import Engine
from .errors import ConfigurationError
from .records import Scope, Status, StoredRecord
from .store_calls import Create, DeleteRecord, Release, TakeOverCall

R = TypeVar("R")
Flow = Generator[Command, Any, R]
UniqueUntil = Literal["start", "finish"]

#: The mark's operation is the task's (or actor's) name behind this prefix.
MARK_PREFIX = "enqueue:"
#: The header (Celery) or message option (Dramatiq, taskiq label) that carries the mark.
MARK_HEADER = "idempotency_unique"
#: What a mark stores as its request hash (a mark has no payload to compare).
_MARK_HASH = "unique-enqueue"
#: uuid5 namespace of the message ids derived from marks (fixed: ids must be stable).
_NAMESPACE = uuid.UUID("6a4f1f0e-8e52-5b7a-9d0c-3e2b1c7d9a10")
#: Create / take-over rounds before settling for the holder we last read (each lost round
#: means another producer just claimed the mark, so one more read almost always finds it).
_ROUNDS = 4


@dataclass(frozen=True, slots=True)
class UniqueMark:
    """A pending-message mark: ``acquired`` is True when this caller holds it (and must
    publish the message with :attr:`message_id`), False when another producer does (and its
    message, with the same :attr:`message_id`, is pending).  ``token`` is the holder's
    fencing token either way."""

    tenant: str
    operation: str
    key: str
    token: int
    acquired: bool
    lease_expires_at: float | None = None

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant, self.operation, self.key)

    @property
    def message_id(self) -> str:
        """The id of the message that holds the mark: a function of (scope, token) only, so
        any producer that reads the mark rebuilds the same handle."""
        return str(uuid.uuid5(_NAMESPACE, f"{self.scope.encoded()}#{self.token}"))

    def header(self, until: UniqueUntil) -> str:
        """The mark as one header value, for the worker that releases it."""
        return json.dumps([self.tenant, self.operation, self.key, self.token, until])


def unique_until(value: str) -> UniqueUntil:
    if value not in ("start", "finish"):
        raise ConfigurationError('unique_until must be "start" or "finish"')
    return "start" if value == "start" else "finish"


def read_header(value: object) -> tuple[UniqueMark, UniqueUntil] | None:
    """The mark a message carries (``None`` for anything that is not one of ours).  Most
    messages carry none: that answer costs one test, no parse."""
    if not value:
        return None
    try:
        tenant, operation, key, token, until = json.loads(str(value))
    except (TypeError, ValueError):
        return None
    if not (isinstance(token, int) and until in ("start", "finish")
            and all(isinstance(part, str) for part in (tenant, operation, key))):
        return None
    return UniqueMark(tenant, operation, key, token, acquired=True), until


def _mark(record: StoredRecord, token: int, acquired: bool, lease: float | None) -> UniqueMark:
    tenant, operation, key = record.scope
    return UniqueMark(tenant, operation, key, token, acquired, lease)


def acquire(engine: Engine, scope: Scope, lease: float) -> Flow[UniqueMark]:
    """Claim the mark, or read its live holder; a holder whose lease expired is taken over,
    a settled leftover (poisoned or completed by recovery) deleted and claimed again."""
    record: StoredRecord | None = None
    for _ in range(_ROUNDS):
        now = engine.clock()
        result = yield Create(scope, _MARK_HASH, now, now + lease)
        record = result.record
        if result.created:
            return _mark(record, record.fencing_token, True, record.lease_expires_at)
        if record.status is not Status.PROCESSING:
            yield DeleteRecord(scope, record.status)
            continue
        if record.lease_expires_at is not None and record.lease_expires_at > now:
            return _mark(record, record.fencing_token, False, record.lease_expires_at)
        taken = yield TakeOverCall(scope, record.fencing_token, now, now + lease)
        if taken is not None:
            return _mark(record, taken.token, True, now + lease)
    assert record is not None
    return _mark(record, record.fencing_token, False, record.lease_expires_at)


def release(scope: Scope, token: int) -> Flow[bool]:
    released: bool = yield Release(scope, token)
    return released


class UniqueMarks(Maintenance):
    """The handler's unique-enqueue calls (the module docstring says what they guarantee)."""

    def acquire_unique(
        self, operation: str, tenant: str, key: str, *, lease_timeout: Seconds | None = None
    ) -> UniqueMark:
        """Claim the pending-message mark of (``tenant``, ``operation``, ``key``) for
        ``lease_timeout`` seconds (default: the operation's ``lease_timeout``).  ``acquired``
        says whether to publish; otherwise the mark names the pending message."""
        scope, lease = self._mark_scope(operation, tenant, key, lease_timeout)
        return self._blocking(acquire(self._engine, scope, lease), "acquire_unique_async")

    async def acquire_unique_async(
        self, operation: str, tenant: str, key: str, *, lease_timeout: Seconds | None = None
    ) -> UniqueMark:
        scope, lease = self._mark_scope(operation, tenant, key, lease_timeout)
        return await drive_async(self._engine, acquire(self._engine, scope, lease))

    def release_unique(self, mark: UniqueMark) -> bool:
        """Release the mark if ``mark.token`` still holds it (a newer holder's mark stays);
        True when this call released it."""
        return self._blocking(release(mark.scope, mark.token), "release_unique_async")

    async def release_unique_async(self, mark: UniqueMark) -> bool:
        return await drive_async(self._engine, release(mark.scope, mark.token))

    def _mark_scope(
        self, operation: str, tenant: str, key: str, lease_timeout: Seconds | None
    ) -> tuple[Scope, float]:
        lease = (self._engine.options_for(operation).lease_timeout if lease_timeout is None
                 else seconds(lease_timeout))
        if lease <= 0:
            raise ConfigurationError("lease_timeout must be positive")
        return self._engine.scope(operation=MARK_PREFIX + operation, tenant=tenant, key=key), lease


__all__ = [
    "MARK_HEADER", "MARK_PREFIX", "UniqueMark", "UniqueMarks", "UniqueUntil", "read_header",
    "unique_until",
]
