"""Background recovery and cleanup: the jobs the production guide says to run from day one.

``recover`` and ``cleanup`` are safe to run from many workers at once: every change they make
is a conditional store write, so a record is handled by exactly one of them.
:class:`MaintenanceRunner` runs both on a schedule inside a worker process, holding a named
lease in the store so that only one worker in the fleet runs each job at a time (how Dramatiq
workers, consumer loops and Celery's ``maintenance="worker"`` mode keep the store healthy
without a beat process).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import ErrorCode, IdempotencyError, make_error
from ._records import Record, Scope, Status, StoredRecord
from ._scope import validate_key, validate_operation, validate_tenant

if TYPE_CHECKING:
    from ._handler import IdempotencyHandler

RECOVER_EVERY = 300.0
CLEANUP_EVERY = 3600.0


def recover(handler: IdempotencyHandler, timeout: float | None, limit: int) -> int:
    now = handler.clock()
    heartbeat_before = None if timeout is None else now - timeout
    stuck = handler.store_call(
        "find_stuck", handler.store.find_stuck, now=now, heartbeat_before=heartbeat_before,
        limit=limit,
    )
    handled = sum(1 for record in stuck if _recover_one(handler, record, now))
    if handled:
        handler.metrics.recovered(handled)
    handler.log.info("recovery_run", found=len(stuck), handled=handled, status="PROCESSING")
    return handled


def _recover_one(handler: IdempotencyHandler, record: StoredRecord, now: float) -> bool:
    s = record.scope
    opts = handler.options_for(s.operation)
    fields = {"tenant": s.tenant, "operation": s.operation, "key": s.key}
    if opts.on_stuck == "fail":
        ok = handler.store_call(
            "mark_failed", handler.store.mark_failed, s, token=record.fencing_token, now=now,
            expires_at=now + opts.ttl, only_if_lease_expired=True,
        )
        if ok:
            handler.metrics.poisoned(s.operation)
            handler.log.warning("recovered_poisoned", status="FAILED", **fields)
        return bool(ok)
    result = handler.store_call(
        "record_failure", handler.store.record_failure, s, token=record.fencing_token, now=now,
        max_retries=opts.max_retries, expires_at=now + opts.ttl, only_if_lease_expired=True,
    )
    if result is None:
        return False
    if result.poisoned:
        handler.metrics.poisoned(s.operation)
    handler.log.warning(
        "recovered",
        status="FAILED" if result.poisoned else "RELEASED",
        retry_count=result.retry_count,
        **fields,
    )
    return True


def cleanup(handler: IdempotencyHandler, limit: int) -> int:
    now = handler.clock()
    purged = handler.store_call(
        "delete_expired", handler.store.delete_expired, now=now,
        counters_before=now - handler.defaults.ttl, limit=limit,
    )
    if purged:
        handler.metrics.cleaned(purged)
    handler.log.info("cleanup_run", purged=purged, status="EXPIRED")
    return int(purged)


def unpoison(
    handler: IdempotencyHandler, *, operation: str, tenant: str, key: str, actor: str
) -> Record:
    scope = Scope(validate_tenant(tenant), validate_operation(operation), validate_key(key))
    count = handler.store_call("get_retry_count", handler.store.get_retry_count, scope)
    deleted = handler.store_call(
        "delete_record", handler.store.delete_record, scope, status=Status.FAILED
    )
    if deleted is None:
        raise make_error(
            ErrorCode.RECORD_NOT_FOUND, "no FAILED record for this scope",
            tenant=scope.tenant, operation=scope.operation, key=scope.key,
        )
    handler.store_call("reset_retry_count", handler.store.reset_retry_count, scope)
    old = handler.to_record(deleted, count)
    handler.log.warning(
        "unpoisoned", actor=actor, tenant=scope.tenant, operation=scope.operation, key=scope.key,
        status="FAILED", old_retry_count=count, old_request_hash=old.request_hash,
        old_created_at=old.created_at, old_updated_at=old.updated_at,
    )
    return old


@dataclass(frozen=True, slots=True)
class MaintenanceSchedule:
    recover_every: float = RECOVER_EVERY
    cleanup_every: float = CLEANUP_EVERY
    recover_timeout: float | None = None
    recover_limit: int = 100
    cleanup_limit: int = 500


class MaintenanceRunner:
    """Runs recovery and cleanup on a schedule in a daemon thread, one worker at a time.

    Each job takes a store lease (``idempotency.recover_stuck`` / ``idempotency.cleanup_expired``)
    for its interval: whichever worker holds it runs the job; the others skip that tick.
    """

    def __init__(
        self,
        handler: IdempotencyHandler,
        schedule: MaintenanceSchedule | None = None,
        *,
        owner: str | None = None,
    ) -> None:
        self.handler = handler
        self.schedule = schedule or MaintenanceSchedule()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs: dict[str, int] = {"recover": 0, "cleanup": 0}
        self._last: dict[str, float] = {}

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name="idempotent-tasks-maintenance", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for name in ("idempotency.recover_stuck", "idempotency.cleanup_expired"):
            with contextlib.suppress(Exception):  # best effort; the lease expires anyway
                self.handler.store.release_lock(name, owner=self.owner)

    def run_once(self) -> dict[str, int | None]:
        """One tick: run each job whose lease this worker gets. ``None``: skipped."""
        sch = self.schedule
        return {
            "recover": self._job(
                "idempotency.recover_stuck", sch.recover_every,
                lambda: self.handler.recover_stuck_records(sch.recover_timeout, sch.recover_limit),
                "recover",
            ),
            "cleanup": self._job(
                "idempotency.cleanup_expired", sch.cleanup_every,
                lambda: self.handler.cleanup_expired_records(sch.cleanup_limit),
                "cleanup",
            ),
        }

    def _job(self, lock: str, every: float, job: Callable[[], int], name: str) -> int | None:
        now = self.handler.clock()
        last = self._last.get(name)
        if last is not None and now - last < every:
            return None  # ran by us within its interval; our lease still covers it
        try:
            if not self.handler.store.acquire_lock(lock, owner=self.owner, now=now, ttl=every):
                return None
            self._last[name] = now
            done = int(job())
            self.runs[name] += 1
            return done
        except IdempotencyError as exc:
            self.handler.log.error("maintenance_failed", job=name, error=exc.message)
        except Exception as exc:
            self.handler.log.error("maintenance_failed", job=name, error=repr(exc))
        return None

    def _loop(self) -> None:
        tick = min(self.schedule.recover_every, self.schedule.cleanup_every)
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(tick)
