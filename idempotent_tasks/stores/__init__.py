"""The store contract, for anyone writing a store: the Protocols and the value types.

A store is a handful of atomic, conditional primitives on one scope's record and its retry
counter (:mod:`idempotent_tasks.stores.base` states the rules); the handler makes every
decision.  Implement :class:`Store` (or :class:`AsyncStore`, every method a coroutine),
exchange the value types below, and run :class:`idempotent_tasks.testing.StoreContract`
against it (docs/stores.md).  These are the very objects the built-in stores use.

Importing this package imports no driver: the built-in stores live in its submodules
(``stores.sql``, ``stores.redis``, …) and in :mod:`idempotent_tasks`.
"""

from __future__ import annotations

from .._core.records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from .base import (
    AdminStore,
    AsyncAdminStore,
    AsyncBatchStore,
    AsyncBodyTransaction,
    AsyncHotPathStore,
    AsyncMaintenanceStore,
    AsyncStore,
    AsyncTransactionalStore,
    BatchStore,
    BodyTransaction,
    ClaimRequest,
    FailureResult,
    HotPathStore,
    MaintenanceStore,
    Store,
    SuccessWrite,
    TakeOver,
    TransactionalStore,
)
from .changes import AsyncChangeFeedStore, ChangeFeedStore
from .effects import AsyncStepStore, AsyncUncertainStore, StepStore, UncertainStore
from .reopen import AsyncReopenStore, ReopenStore

__all__ = [
    "AdminStore",
    "AsyncAdminStore",
    "AsyncBatchStore",
    "AsyncBodyTransaction",
    "AsyncChangeFeedStore",
    "AsyncHotPathStore",
    "AsyncMaintenanceStore",
    "AsyncReopenStore",
    "AsyncStepStore",
    "AsyncStore",
    "AsyncTransactionalStore",
    "AsyncUncertainStore",
    "BatchStore",
    "BodyTransaction",
    "ChangeFeedStore",
    "ClaimRequest",
    "CreateOutcome",
    "CreateResult",
    "FailureResult",
    "HotPathStore",
    "MaintenanceStore",
    "ReopenStore",
    "Scope",
    "Status",
    "StepStore",
    "Store",
    "StoredRecord",
    "SuccessWrite",
    "TakeOver",
    "TransactionalStore",
    "UncertainStore",
]
