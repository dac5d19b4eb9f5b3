"""The store contract every backend implements.

A store is a small set of *atomic* primitives on one scope's record and its retry counter.
All decisions (what a duplicate means, when to poison, which clock) live in the handler;
stores only execute conditional writes and report what happened.  Timestamps are always
passed in by the handler (``now`` from its injectable clock): stores never read a clock of
their own for anything the contract depends on.

Rules every implementation follows (:class:`idempotent_tasks.testing.StoreContract` checks
each one, on a sync store or an async one):

* ``create`` is atomic: of any number of concurrent callers for one scope exactly one gets
  ``CREATED``, and the *store* picks the new attempt's fencing token (returned in the
  record).  A record whose ``expires_at`` is set and ``<= now`` counts as absent and is
  replaced atomically; replacing an expired record also resets the scope's retry counter
  (a scope re-created after expiry starts fresh).  ``DUPLICATE`` carries the existing record,
  read in the same round trip.
* Fencing tokens are monotonic per scope: every new attempt (a first claim, a claim after a
  release or after expiry, a takeover) gets a token greater than every earlier attempt's
  token of that scope, and no two attempts share one.  A store-wide (or per-shard) sequence
  advanced inside the claim's own atomic step is the usual way; it costs no round trip.
* Every write on an existing record is conditional on ``status == PROCESSING`` **and**
  ``fencing_token == token``; a write whose condition fails changes nothing and reports it.
* The retry counter lives apart from the record: releasing or deleting a record never
  touches it, and it never decreases (only ``reset_retry_count``, the operator's
  ``unpoison``, and replacing an expired record reset it).
* Driver errors are translated at the boundary into
  :class:`~idempotent_tasks.StoreUnavailableError` (``raise ... from exc``).
* Constructors never connect; the first call does, within the store's connect timeout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# The value types below are plain slotted dataclasses, not frozen ones (a frozen dataclass
# costs several times more to build, and a batch builds one per message): treat them as
# read-only.
from .._core.records import CreateResult, Scope, Status, StoredRecord


@dataclass(slots=True)
class ClaimRequest:
    """One scope to claim in ``create_many`` (the store picks its token)."""

    scope: Scope
    request_hash: str


@dataclass(slots=True)
class TakeOver:
    """What a successful ``take_over`` did: the counter after the increment (the crashed
    attempt counts) and the new attempt's fencing token."""

    retry_count: int
    token: int


@dataclass(slots=True)
class SuccessWrite:
    """One scope to complete in ``mark_success_many``."""

    scope: Scope
    token: int
    response: bytes
    expires_at: float


@dataclass(slots=True)
class FailureResult:
    """What ``record_failure`` did: the counter after the increment, and whether the record
    was poisoned (FAILED) rather than released (deleted)."""

    retry_count: int
    poisoned: bool


@runtime_checkable
class HotPathStore(Protocol):
    """What every delivery uses: claim, decide, renew, record."""

    #: Label for metrics and logs, e.g. ``"memory"``, ``"sqlite"``, ``"postgresql"``, ``"redis"``.
    name: str

    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        """Insert a PROCESSING record with a new fencing token, or return the live existing
        one (read in the same round trip)."""
        ...

    def get(self, scope: Scope) -> StoredRecord | None:
        """The stored record, expired or not (the handler interprets expiry)."""
        ...

    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        now: float,
        lease_expires_at: float,
    ) -> TakeOver | None:
        """Atomically, if the record is PROCESSING with ``expected_token`` and its lease has
        expired (``lease_expires_at <= now``): give it to a new attempt (a new, greater
        fencing token) with a fresh lease and increment the retry counter (the crashed
        attempt counts).  ``None`` when the condition did not hold (nothing changed)."""
        ...

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        """Extend our lease (and ``updated_at``); False when we no longer own the record."""
        ...

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """PROCESSING + token → SUCCESS with ``response``; False when the condition failed."""
        ...

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
        """PROCESSING + token (+ lease expired when asked) → FAILED (poisoned), keeping
        ``response`` in the record when given (what a duplicate of the poisoned scope gets
        back with its refusal); ``get`` returns it with the FAILED record."""
        ...

    def release(self, scope: Scope, *, token: int) -> bool:
        """Delete the record if PROCESSING + token; the retry counter is untouched."""
        ...

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
        """One atomic step for a transient failure (or a crashed attempt found by recovery):
        if the record is PROCESSING with ``token`` (and, when asked, its lease expired at
        ``now``), increment the counter; if it reached ``max_retries`` mark the record FAILED
        (``expires_at``), else delete it.  ``None`` when the condition failed: nothing was
        counted, because the attempt no longer owns the scope."""
        ...

    def get_retry_count(self, scope: Scope) -> int:
        ...


@runtime_checkable
class BatchStore(Protocol):
    """Claims and completions for many scopes in one round trip."""

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        """``create`` for many scopes in one round trip where the backend allows; results in
        the order of ``claims``.  Each claim is individually atomic.  Scopes in one call are
        distinct (the caller de-duplicates)."""
        ...

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        """``mark_success`` for many scopes in one round trip where the backend allows;
        results in the order of ``writes``.  Each write is individually conditional on its
        own status and token.  Scopes in one call are distinct (the caller de-duplicates)."""
        ...


@runtime_checkable
class MaintenanceStore(Protocol):
    """Recovery, cleanup and the named leases that schedule them."""

    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        """PROCESSING records whose lease expired at ``now`` (and, when given, whose
        ``updated_at`` is older than ``heartbeat_before``), oldest first, at most ``limit``."""
        ...

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        """Purge up to ``limit`` records with ``expires_at <= now``, then up to ``limit``
        counters whose scope has no record and whose last change is older than
        ``counters_before`` (oldest first).  Returns the number of records purged.  Safe to
        run from many workers at once."""
        ...

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        """A named lease for maintenance jobs: True if ``owner`` now holds ``name`` until
        ``now + ttl`` (free, expired, or already ours — then extended)."""
        ...

    def release_lock(self, name: str, *, owner: str) -> None:
        ...


@runtime_checkable
class AdminStore(Protocol):
    """What operators (CLI, admin pages) and deployments use."""

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        """Delete the record (only if it has ``status`` when given); returns what was deleted."""
        ...

    def reset_retry_count(self, scope: Scope) -> None:
        """Operator reset (``unpoison``) only."""
        ...

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        """A page of records ordered by (created_at, tenant, operation, key), for operators."""
        ...

    def stats(self) -> Mapping[tuple[str, Status], int]:
        """Counts of records by (operation, status)."""
        ...

    def create_schema(self) -> None:
        """Create tables/scripts if missing; idempotent.  A no-op where nothing is needed."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class Store(HotPathStore, BatchStore, MaintenanceStore, AdminStore, Protocol):
    """The whole contract: every store implements all four parts."""


class BodyTransaction(Protocol):
    """One open database transaction for an ``execute_in_transaction`` body
    (docs/transactional.md)."""

    #: What the body receives: a SQLAlchemy ``Connection`` inside the open transaction.
    connection: Any

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """The conditional SUCCESS update (PROCESSING + token), *inside* this transaction."""
        ...

    def is_intact(self) -> bool:
        """False when the body committed or rolled back the transaction itself."""
        ...

    def commit(self) -> None:
        ...

    def rollback(self) -> None:
        ...


@runtime_checkable
class TransactionalStore(Store, Protocol):
    """A store whose records live in a SQL database the body can write to
    (docs/transactional.md)."""

    def body_transaction(self) -> AbstractContextManager[BodyTransaction]:
        """Open a connection and begin a transaction; on exit without ``commit`` it rolls
        back, and the connection is always returned."""
        ...


# -- the async face: the same contract, every method a coroutine --------------------------------
@runtime_checkable
class AsyncHotPathStore(Protocol):
    """:class:`HotPathStore` with coroutine methods, awaited on the caller's event loop.

    Its coroutine methods are what makes a store async: the handler awaits them on its
    event loop (no thread hop), and ``handler.execute`` on it is ``CONFIGURATION_ERROR``.
    No flag says it."""

    name: str

    async def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult: ...

    async def get(self, scope: Scope) -> StoredRecord | None: ...

    async def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None: ...

    async def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> bool: ...

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool: ...

    async def mark_failed(
        self, scope: Scope, *, token: int, now: float, expires_at: float,
        only_if_lease_expired: bool = False, response: bytes | None = None,
    ) -> bool: ...

    async def release(self, scope: Scope, *, token: int) -> bool: ...

    async def record_failure(
        self, scope: Scope, *, token: int, now: float, max_retries: int, expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None: ...

    async def get_retry_count(self, scope: Scope) -> int: ...


@runtime_checkable
class AsyncBatchStore(Protocol):
    """:class:`BatchStore` with coroutine methods."""

    async def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]: ...

    async def mark_success_many(
        self, writes: Sequence[SuccessWrite], *, now: float
    ) -> list[bool]: ...


@runtime_checkable
class AsyncMaintenanceStore(Protocol):
    """:class:`MaintenanceStore` with coroutine methods."""

    async def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]: ...

    async def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int: ...

    async def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool: ...

    async def release_lock(self, name: str, *, owner: str) -> None: ...


@runtime_checkable
class AsyncAdminStore(Protocol):
    """:class:`AdminStore` with coroutine methods."""

    async def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> StoredRecord | None: ...

    async def reset_retry_count(self, scope: Scope) -> None: ...

    async def list_records(
        self, *, status: Status | None = None, operation: str | None = None,
        tenant: str | None = None, limit: int = 100, offset: int = 0,
    ) -> list[StoredRecord]: ...

    async def stats(self) -> Mapping[tuple[str, Status], int]: ...

    async def create_schema(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class AsyncStore(
    AsyncHotPathStore, AsyncBatchStore, AsyncMaintenanceStore, AsyncAdminStore, Protocol
):
    """The whole contract for an asyncio store (``AsyncSQLStore``, ``AsyncRedisStore``):
    every rule of the module docstring holds, each method is awaited on the event loop that
    first used the store (build one store per loop)."""


class AsyncBodyTransaction(Protocol):
    """:class:`BodyTransaction` for an async store: the body gets ``connection`` (e.g. a
    ``psycopg.AsyncConnection``) inside the open transaction."""

    connection: Any

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool: ...

    def is_intact(self) -> bool: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


@runtime_checkable
class AsyncTransactionalStore(AsyncStore, Protocol):
    """An async store whose records live in a SQL database the body can write to."""

    def body_transaction(self) -> AbstractAsyncContextManager[AsyncBodyTransaction]:
        """As :meth:`TransactionalStore.body_transaction`, entered with ``async with``."""
        ...
