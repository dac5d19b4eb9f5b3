"""Waiting for a running attempt's outcome (``on_in_progress="wait"``).

A duplicate that finds its scope PROCESSING under a live lease can come back later (the
default: ``in_progress``, the broker or client retries) or wait here for the running attempt
to settle and answer with its outcome — the replay, or the poisoned refusal — as Temporal's
``USE_EXISTING`` and Restate do.  The wait is bounded three ways: by ``wait_timeout`` (real
elapsed time, whatever clock the handler stamps records with), by the running attempt's
lease (a waiter whose attempt crashed answers ``in_progress``: the takeover is the next
delivery's, after the lease expires), and by a per-process cap on concurrent waiters (past
it a duplicate answers ``in_progress`` at once instead of holding a thread or a task).

Between looks at the record the waiter sleeps with a doubling backoff (a few milliseconds,
up to a quarter of a second): one ``get`` per look, never a busy loop.  A store that can
tell when a scope changes (``wait_for_change``) wakes the waiter early instead.
"""

from __future__ import annotations

import asyncio
import threading
import time

from .commands import Command, Runtime
from .records import Scope

DEFAULT_MAX_WAITERS = 1000


class Waiters:
    """How many duplicates of this process wait at once, bounded (a slot per waiter)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("max_waiters must be zero or positive")
        self.limit = limit
        self.count = 0
        self._lock = threading.Lock()

    def enter(self) -> bool:
        with self._lock:
            if self.count >= self.limit:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


class Nap(Command):
    """Sleep until the scope may have changed: ``seconds`` at most, less when the store can
    say so (``wait_for_change`` / its coroutine twin)."""

    __slots__ = ("scope", "seconds")

    def __init__(self, scope: Scope, seconds: float) -> None:
        self.scope = scope
        self.seconds = seconds

    def sync(self, engine: Runtime) -> None:
        waiter = getattr(engine.store, "wait_for_change", None)
        if waiter is None:
            time.sleep(self.seconds)
        else:
            waiter(self.scope, timeout=self.seconds)

    async def run_async(self, engine: Runtime) -> None:
        waiter = getattr(engine.store, "wait_for_change_async", None)
        if waiter is None:
            await asyncio.sleep(self.seconds)
        else:
            await waiter(self.scope, timeout=self.seconds)


__all__ = ["DEFAULT_MAX_WAITERS", "Nap", "Waiters"]
