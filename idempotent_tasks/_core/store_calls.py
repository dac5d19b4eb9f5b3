"""Every store operation the algorithm performs, as one typed value.

A flow yields one of these; the instrumented wrapper (:mod:`.instrumented`) runs it with
``invoke(store)``, timed, counted and translated.  Each ``invoke`` calls the store method with
keyword arguments spelled out, against the union of the sync and async store Protocols, so
``mypy --strict`` checks every call the engine makes against both (a renamed parameter or a
missing method is a type error, not a runtime ``TypeError`` in production).  ``invoke``
returns the result on a sync store and an awaitable on an async one; the wrapper knows which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, cast

from .commands import Command, Runtime
from .records import Scope, Status

if TYPE_CHECKING:
    from ..stores.base import AsyncStore, ClaimRequest, Store, SuccessWrite
    from ..stores.effects import (
        AsyncStepStore,
        AsyncUncertainStore,
        Resolution,
        StepStore,
        UncertainStore,
    )
    from ..stores.reopen import AsyncReopenStore, ReopenStore

    AnyStore: TypeAlias = Store | AsyncStore


class StoreCall(Command):
    """One store operation; ``name`` labels its metrics and logs (the store method's name)."""

    __slots__ = ()
    name: ClassVar[str]

    def invoke(self, store: AnyStore) -> Any:
        raise NotImplementedError

    @property
    def subject(self) -> Scope | None:
        """The scope the call is about, for its error log line (maintenance calls have none)."""
        scope = getattr(self, "scope", None)
        return scope if isinstance(scope, Scope) else None

    def sync(self, engine: Runtime) -> Any:
        return engine.io.call(self)

    async def run_async(self, engine: Runtime) -> Any:
        return await engine.io.call_async(self)


# -- the hot path -------------------------------------------------------------------------
@dataclass(slots=True)
class Create(StoreCall):
    name: ClassVar[str] = "create"
    scope: Scope
    request_hash: str
    now: float
    lease_expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        return store.create(self.scope, request_hash=self.request_hash, now=self.now,
                            lease_expires_at=self.lease_expires_at)


@dataclass(slots=True)
class Get(StoreCall):
    name: ClassVar[str] = "get"
    scope: Scope

    def invoke(self, store: AnyStore) -> Any:
        return store.get(self.scope)


@dataclass(slots=True)
class TakeOverCall(StoreCall):
    name: ClassVar[str] = "take_over"
    scope: Scope
    expected_token: int
    now: float
    lease_expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        return store.take_over(self.scope, expected_token=self.expected_token, now=self.now,
                               lease_expires_at=self.lease_expires_at)


@dataclass(slots=True)
class Reopen(StoreCall):
    """A settled scope given to a new attempt (the reuse policies; ``stores.reopen``)."""

    name: ClassVar[str] = "reopen"
    scope: Scope
    expected_token: int
    now: float
    lease_expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        reopenable = cast("ReopenStore | AsyncReopenStore", store)  # the policy checked it
        return reopenable.reopen(
            self.scope, expected_token=self.expected_token, now=self.now,
            lease_expires_at=self.lease_expires_at,
        )


# -- effects outside the database (stores.effects; checked before they are used) ------------
@dataclass(slots=True)
class SaveSteps(StoreCall):
    name: ClassVar[str] = "save_steps"
    scope: Scope
    token: int
    steps: bytes
    now: float

    def invoke(self, store: AnyStore) -> Any:
        return cast("StepStore | AsyncStepStore", store).save_steps(
            self.scope, token=self.token, steps=self.steps, now=self.now
        )


@dataclass(slots=True)
class LoadSteps(StoreCall):
    name: ClassVar[str] = "load_steps"
    scope: Scope

    def invoke(self, store: AnyStore) -> Any:
        return cast("StepStore | AsyncStepStore", store).load_steps(self.scope)


@dataclass(slots=True)
class MarkUncertain(StoreCall):
    name: ClassVar[str] = "mark_uncertain"
    scope: Scope
    token: int
    now: float
    detail: bytes | None

    def invoke(self, store: AnyStore) -> Any:
        return cast("UncertainStore | AsyncUncertainStore", store).mark_uncertain(
            self.scope, token=self.token, now=self.now, detail=self.detail
        )


@dataclass(slots=True)
class ResolveUncertain(StoreCall):
    name: ClassVar[str] = "resolve_uncertain"
    scope: Scope
    resolution: Resolution
    now: float
    response: bytes | None = None
    expires_at: float | None = None

    def invoke(self, store: AnyStore) -> Any:
        return cast("UncertainStore | AsyncUncertainStore", store).resolve_uncertain(
            self.scope, resolution=self.resolution, now=self.now, response=self.response,
            expires_at=self.expires_at,
        )


@dataclass(slots=True)
class Heartbeat(StoreCall):
    name: ClassVar[str] = "heartbeat"
    scope: Scope
    token: int
    now: float
    lease_expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        return store.heartbeat(self.scope, token=self.token, now=self.now,
                               lease_expires_at=self.lease_expires_at)


@dataclass(slots=True)
class MarkSuccess(StoreCall):
    name: ClassVar[str] = "mark_success"
    scope: Scope
    token: int
    response: bytes
    now: float
    expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        return store.mark_success(self.scope, token=self.token, response=self.response,
                                  now=self.now, expires_at=self.expires_at)


@dataclass(slots=True)
class MarkFailed(StoreCall):
    name: ClassVar[str] = "mark_failed"
    scope: Scope
    token: int
    now: float
    expires_at: float
    only_if_lease_expired: bool = False
    response: bytes | None = None

    def invoke(self, store: AnyStore) -> Any:
        if self.response is None:  # a store written before ``response=`` still works
            return store.mark_failed(self.scope, token=self.token, now=self.now,
                                     expires_at=self.expires_at,
                                     only_if_lease_expired=self.only_if_lease_expired)
        return store.mark_failed(self.scope, token=self.token, now=self.now,
                                 expires_at=self.expires_at, response=self.response,
                                 only_if_lease_expired=self.only_if_lease_expired)


@dataclass(slots=True)
class Release(StoreCall):
    name: ClassVar[str] = "release"
    scope: Scope
    token: int

    def invoke(self, store: AnyStore) -> Any:
        return store.release(self.scope, token=self.token)


@dataclass(slots=True)
class RecordFailure(StoreCall):
    name: ClassVar[str] = "record_failure"
    scope: Scope
    token: int
    now: float
    max_retries: int
    expires_at: float
    only_if_lease_expired: bool = False

    def invoke(self, store: AnyStore) -> Any:
        return store.record_failure(self.scope, token=self.token, now=self.now,
                                    max_retries=self.max_retries, expires_at=self.expires_at,
                                    only_if_lease_expired=self.only_if_lease_expired)


@dataclass(slots=True)
class GetRetryCount(StoreCall):
    name: ClassVar[str] = "get_retry_count"
    scope: Scope

    def invoke(self, store: AnyStore) -> Any:
        return store.get_retry_count(self.scope)


# -- batches ------------------------------------------------------------------------------
@dataclass(slots=True)
class CreateMany(StoreCall):
    name: ClassVar[str] = "create_many"
    claims: Sequence[ClaimRequest]
    now: float
    lease_expires_at: float

    def invoke(self, store: AnyStore) -> Any:
        return store.create_many(self.claims, now=self.now,
                                 lease_expires_at=self.lease_expires_at)


@dataclass(slots=True)
class MarkSuccessMany(StoreCall):
    name: ClassVar[str] = "mark_success_many"
    writes: Sequence[SuccessWrite]
    now: float

    def invoke(self, store: AnyStore) -> Any:
        return store.mark_success_many(self.writes, now=self.now)


# -- maintenance and operators --------------------------------------------------------------
@dataclass(slots=True)
class FindStuck(StoreCall):
    name: ClassVar[str] = "find_stuck"
    now: float
    heartbeat_before: float | None
    limit: int

    def invoke(self, store: AnyStore) -> Any:
        return store.find_stuck(now=self.now, heartbeat_before=self.heartbeat_before,
                                limit=self.limit)


@dataclass(slots=True)
class DeleteExpired(StoreCall):
    name: ClassVar[str] = "delete_expired"
    now: float
    counters_before: float
    limit: int

    def invoke(self, store: AnyStore) -> Any:
        return store.delete_expired(now=self.now, counters_before=self.counters_before,
                                    limit=self.limit)


@dataclass(slots=True)
class AcquireLock(StoreCall):
    name: ClassVar[str] = "acquire_lock"
    lock: str
    owner: str
    now: float
    ttl: float

    def invoke(self, store: AnyStore) -> Any:
        return store.acquire_lock(self.lock, owner=self.owner, now=self.now, ttl=self.ttl)


@dataclass(slots=True)
class ReleaseLock(StoreCall):
    name: ClassVar[str] = "release_lock"
    lock: str
    owner: str

    def invoke(self, store: AnyStore) -> Any:
        return store.release_lock(self.lock, owner=self.owner)


@dataclass(slots=True)
class DeleteRecord(StoreCall):
    name: ClassVar[str] = "delete_record"
    scope: Scope
    status: Status | None = None

    def invoke(self, store: AnyStore) -> Any:
        return store.delete_record(self.scope, status=self.status)


@dataclass(slots=True)
class ResetRetryCount(StoreCall):
    name: ClassVar[str] = "reset_retry_count"
    scope: Scope

    def invoke(self, store: AnyStore) -> Any:
        return store.reset_retry_count(self.scope)


@dataclass(slots=True)
class ListRecords(StoreCall):
    name: ClassVar[str] = "list_records"
    status: Status | None = None
    operation: str | None = None
    tenant: str | None = None
    limit: int = 100
    offset: int = 0

    def invoke(self, store: AnyStore) -> Any:
        return store.list_records(status=self.status, operation=self.operation,
                                  tenant=self.tenant, limit=self.limit, offset=self.offset)


@dataclass(slots=True)
class Stats(StoreCall):
    name: ClassVar[str] = "stats"

    def invoke(self, store: AnyStore) -> Any:
        return store.stats()


@dataclass(slots=True)
class CreateSchema(StoreCall):
    name: ClassVar[str] = "create_schema"

    def invoke(self, store: AnyStore) -> Any:
        return store.create_schema()


__all__ = [
    "AcquireLock",
    "Create",
    "CreateMany",
    "CreateSchema",
    "DeleteExpired",
    "DeleteRecord",
    "FindStuck",
    "Get",
    "GetRetryCount",
    "Heartbeat",
    "ListRecords",
    "LoadSteps",
    "MarkFailed",
    "MarkSuccess",
    "MarkSuccessMany",
    "MarkUncertain",
    "RecordFailure",
    "Release",
    "ReleaseLock",
    "Reopen",
    "ResetRetryCount",
    "ResolveUncertain",
    "SaveSteps",
    "Stats",
    "StoreCall",
    "TakeOverCall",
]
