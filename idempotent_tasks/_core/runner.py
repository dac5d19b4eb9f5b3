"""Recovery and cleanup on a schedule inside a worker process, one worker of the fleet at a
time: how Dramatiq workers, consumer loops and Celery's ``maintenance="worker"`` mode keep
the store healthy without a beat process.

Each job takes a named lease in the store (``idempotency.recover_stuck`` /
``idempotency.cleanup_expired``) for its interval: whichever worker holds it runs the job;
the others skip that tick.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .errors import IdempotencyError
from .handler import IdempotencyHandler

RECOVER_EVERY = 300.0
CLEANUP_EVERY = 3600.0
RECOVER_LOCK = "idempotency.recover_stuck"
CLEANUP_LOCK = "idempotency.cleanup_expired"


@dataclass(frozen=True, slots=True)
class MaintenanceSchedule:
    recover_every: float = RECOVER_EVERY
    cleanup_every: float = CLEANUP_EVERY
    recover_timeout: float | None = None
    recover_limit: int = 100
    cleanup_limit: int = 500


class MaintenanceRunner:
    """Runs recovery and cleanup on a schedule in a daemon thread, one worker at a time."""

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
        for name in (RECOVER_LOCK, CLEANUP_LOCK):
            with contextlib.suppress(Exception):  # best effort; the lease expires anyway
                self.handler.unlock(name, owner=self.owner)

    def run_once(self) -> dict[str, int | None]:
        """One tick: run each job whose lease this worker gets. ``None``: skipped."""
        sch = self.schedule
        return {
            "recover": self._job(
                RECOVER_LOCK, sch.recover_every,
                lambda: self.handler.recover_stuck_records(sch.recover_timeout, sch.recover_limit),
                "recover",
            ),
            "cleanup": self._job(
                CLEANUP_LOCK, sch.cleanup_every,
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
            if not self.handler.try_lock(lock, owner=self.owner, ttl=every):
                return None
            self._last[name] = now
            done = int(job())
            self.runs[name] += 1
            return done
        except IdempotencyError as exc:
            self.handler.logger.error("maintenance_failed", job=name, error=exc.message)
        except Exception as exc:
            self.handler.logger.error("maintenance_failed", job=name, error=repr(exc))
        return None

    def _loop(self) -> None:
        tick = min(self.schedule.recover_every, self.schedule.cleanup_every)
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(tick)


__all__ = [
    "CLEANUP_EVERY",
    "RECOVER_EVERY",
    "MaintenanceRunner",
    "MaintenanceSchedule",
]
