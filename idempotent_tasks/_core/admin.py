"""The handler's maintenance and operator calls, each with its async twin.

Every call is one flow (a generator of store commands, like the execution algorithm), run by
the synchronous driver for ``name(...)`` and by the async one for ``await name_async(...)``:

==============================  ======================================
sync (a sync store)             async (any store; no thread hop on an async one)
==============================  ======================================
``get_record``                  ``get_record_async``
``get_attempts``                ``get_attempts_async``
``recover_stuck_records``       ``recover_stuck_records_async``
``cleanup_expired_records``     ``cleanup_expired_records_async``
``unpoison``                    ``unpoison_async``
``list_records``                ``list_records_async``
``find_stuck_records``          ``find_stuck_records_async``
``record_counts``               ``record_counts_async``
``retry_count``                 ``retry_count_async``
``create_schema``               ``create_schema_async``
``try_lock`` / ``unlock``       ``try_lock_async`` / ``unlock_async``
==============================  ======================================

On an async store (``AsyncSQLStore``, ``AsyncRedisStore``) the sync names raise
``CONFIGURATION_ERROR`` naming their twin: their store calls are coroutines.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, TypeVar

from ..stores.base import TransactionalStore
from ..stores.effects import Resolution
from ..typing import Seconds, seconds
from . import maintenance
from . import store_calls as sc
from .attempts import Attempt, read_attempts
from .commands import Command
from .drivers import drive, drive_async
from .engine import Engine
from .errors import ConfigurationError
from .records import Record, Status, StoredRecord

R = TypeVar("R")
Flow = Generator[Command, Any, R]


class Maintenance:
    """Maintenance and operator calls (see the module docstring for the async twins), on
    the handler's engine: the part of the handler's public face that is not running bodies."""

    _engine: Engine

    @property
    def supports_transactions(self) -> bool:
        """True when the store can run bodies in its own transaction (``transactional=True``)."""
        return isinstance(self._engine.store, TransactionalStore)

    # ------------------------------------------------------------------ drivers
    def _blocking(self, flow: Flow[R], twin: str) -> R:
        if self._engine.io.native_async:
            flow.close()
            name = type(self._engine.store).__name__
            raise ConfigurationError(
                f"{name} is an async store: use `await handler.{twin}(...)`"
            )
        return drive(self._engine, flow)

    # ------------------------------------------------------------------ maintenance
    def get_record(self, *, operation: str, tenant: str, key: str) -> Record | None:
        """The live record of a scope (an expired one counts as absent), counter included."""
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return self._blocking(maintenance.get_record(self._engine, scope), "get_record_async")

    async def get_record_async(self, *, operation: str, tenant: str, key: str) -> Record | None:
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return await drive_async(self._engine, maintenance.get_record(self._engine, scope))

    def get_attempts(self, *, operation: str, tenant: str, key: str) -> list[Attempt]:
        """The scope's past attempts, oldest first: the settled attempts (their token,
        status, time and detail) that ``on_failure="allow_new_attempt"`` or ``reuse_after``
        replaced with a new one, the last ten of them.  The current attempt is
        ``get_record``'s; ``[]`` when none was replaced (or the store records no steps)."""
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return self._blocking(read_attempts(self._engine, scope), "get_attempts_async")

    async def get_attempts_async(
        self, *, operation: str, tenant: str, key: str
    ) -> list[Attempt]:
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return await drive_async(self._engine, read_attempts(self._engine, scope))

    def recover_stuck_records(self, timeout: Seconds | None = None, limit: int = 100) -> int:
        """Handle PROCESSING records whose lease expired (and, with ``timeout``, whose last
        heartbeat is older than it): count the crashed attempt and release or poison
        (``on_stuck="retry"``), or poison (``"fail"``).  Returns the records handled."""
        flow = maintenance.recover(self._engine, _opt_seconds(timeout), limit)
        return self._blocking(flow, "recover_stuck_records_async")

    async def recover_stuck_records_async(
        self, timeout: Seconds | None = None, limit: int = 100
    ) -> int:
        flow = maintenance.recover(self._engine, _opt_seconds(timeout), limit)
        return await drive_async(self._engine, flow)

    def cleanup_expired_records(self, limit: int = 500) -> int:
        """Purge expired SUCCESS/FAILED records and stale counters; returns records purged."""
        flow = maintenance.cleanup(self._engine, limit)
        return self._blocking(flow, "cleanup_expired_records_async")

    async def cleanup_expired_records_async(self, limit: int = 500) -> int:
        return await drive_async(self._engine, maintenance.cleanup(self._engine, limit))

    def unpoison(self, *, operation: str, tenant: str, key: str, actor: str = "operator") -> Record:
        """Delete a FAILED record and reset its counter (audited); RECORD_NOT_FOUND if absent."""
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return self._blocking(maintenance.unpoison(self._engine, scope, actor), "unpoison_async")

    async def unpoison_async(
        self, *, operation: str, tenant: str, key: str, actor: str = "operator"
    ) -> Record:
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return await drive_async(self._engine, maintenance.unpoison(self._engine, scope, actor))

    def resolve(
        self, *, operation: str, tenant: str, key: str, done: Any = maintenance.UNSET,
        retry: bool = False, fail: bool = False, by: str,
    ) -> Record | None:
        """Settle an UNCERTAIN scope (audited, ``by`` names who): ``done=<result>`` records
        SUCCESS with that result, ``retry=True`` releases it (the next delivery runs),
        ``fail=True`` poisons it.  The record after it (``None`` after ``retry``);
        RECORD_NOT_FOUND when the scope is not UNCERTAIN."""
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        flow = maintenance.resolve(self._engine, scope, _resolution(done, retry, fail), done, by)
        return self._blocking(flow, "resolve_async")

    async def resolve_async(
        self, *, operation: str, tenant: str, key: str, done: Any = maintenance.UNSET,
        retry: bool = False, fail: bool = False, by: str,
    ) -> Record | None:
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        flow = maintenance.resolve(self._engine, scope, _resolution(done, retry, fail), done, by)
        return await drive_async(self._engine, flow)

    # ------------------------------------------------------------------ operators
    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Record]:
        """A page of records (oldest first), each with its counter, for operators."""
        flow = self._listed(sc.ListRecords(status, operation, tenant, limit, offset))
        return self._blocking(flow, "list_records_async")

    async def list_records_async(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Record]:
        flow = self._listed(sc.ListRecords(status, operation, tenant, limit, offset))
        return await drive_async(self._engine, flow)

    def find_stuck_records(
        self, *, timeout: Seconds | None = None, limit: int = 100
    ) -> list[Record]:
        """What ``recover_stuck_records`` would handle now, without changing anything."""
        return self._blocking(self._stuck(timeout, limit), "find_stuck_records_async")

    async def find_stuck_records_async(
        self, *, timeout: Seconds | None = None, limit: int = 100
    ) -> list[Record]:
        return await drive_async(self._engine, self._stuck(timeout, limit))

    def _stuck(self, timeout: Seconds | None, limit: int) -> Flow[list[Record]]:
        now = self._engine.clock()
        before = None if timeout is None else now - seconds(timeout)
        return self._listed(sc.FindStuck(now, before, limit))

    def _listed(self, command: sc.ListRecords | sc.FindStuck) -> Flow[list[Record]]:
        rows: list[StoredRecord] = yield command
        records = []
        for row in rows:
            count = yield sc.GetRetryCount(row.scope)
            records.append(self._engine.to_record(row, count))
        return records

    def record_counts(self) -> Mapping[tuple[str, Status], int]:
        """Counts of records by (operation, status)."""
        counts: Mapping[tuple[str, Status], int] = self._blocking(
            _one(sc.Stats()), "record_counts_async"
        )
        return counts

    async def record_counts_async(self) -> Mapping[tuple[str, Status], int]:
        counts: Mapping[tuple[str, Status], int] = await drive_async(self._engine, _one(sc.Stats()))
        return counts

    def create_schema(self) -> None:
        """Create the store's tables / scripts if missing (``idempotent-tasks migrate``)."""
        self._blocking(_one(sc.CreateSchema()), "create_schema_async")

    async def create_schema_async(self) -> None:
        await drive_async(self._engine, _one(sc.CreateSchema()))

    def try_lock(self, name: str, *, owner: str, ttl: float) -> bool:
        """A named lease in the store (maintenance jobs): True if ``owner`` holds it now."""
        flow = _one(sc.AcquireLock(name, owner, self._engine.clock(), ttl))
        return bool(self._blocking(flow, "try_lock_async"))

    async def try_lock_async(self, name: str, *, owner: str, ttl: float) -> bool:
        flow = _one(sc.AcquireLock(name, owner, self._engine.clock(), ttl))
        return bool(await drive_async(self._engine, flow))

    def unlock(self, name: str, *, owner: str) -> None:
        self._blocking(_one(sc.ReleaseLock(name, owner)), "unlock_async")

    async def unlock_async(self, name: str, *, owner: str) -> None:
        await drive_async(self._engine, _one(sc.ReleaseLock(name, owner)))

    # -- added for the CLI (``inspect``/``unpoison`` of a scope without a record) ----------
    def retry_count(self, *, operation: str, tenant: str, key: str) -> int:
        """The scope's retry counter, which lives apart from its record: a scope released
        after transient failures has no record but keeps the attempts it counted."""
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return int(self._blocking(_one(sc.GetRetryCount(scope)), "retry_count_async"))

    async def retry_count_async(self, *, operation: str, tenant: str, key: str) -> int:
        scope = self._engine.scope(operation=operation, tenant=tenant, key=key)
        return int(await drive_async(self._engine, _one(sc.GetRetryCount(scope))))


def _one(command: sc.StoreCall) -> Flow[Any]:
    return (yield command)


def _resolution(done: Any, retry: bool, fail: bool) -> Resolution:
    """The one resolution ``resolve`` was given (exactly one of them)."""
    chosen = [name for name, given in (
        ("done", done is not maintenance.UNSET), ("retry", retry), ("fail", fail)
    ) if given]
    if len(chosen) != 1:
        raise ConfigurationError(
            "resolve needs exactly one of done=<result>, retry=True, fail=True"
        )
    resolution: Resolution = chosen[0]  # type: ignore[assignment]
    return resolution


def _opt_seconds(value: Seconds | None) -> float | None:
    return None if value is None else seconds(value)


__all__ = ["Maintenance"]
