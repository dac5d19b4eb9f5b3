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
up to a quarter of a second): one ``get`` per look, never a busy loop.  A store with a
change feed (``stores.changes``: PostgreSQL ``LISTEN``/``NOTIFY``, Redis pub/sub, the memory
store) wakes the waiter when the running attempt announces its outcome, and the naps grow
longer (they only catch an announcement that was missed).  Only operations that wait
announce: the default path pays nothing.
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


#: With a change feed a nap may last this many times longer than the polling schedule's:
#: the running attempt's announcement cuts it short, and the nap's end is only the safety
#: net for an announcement missed (made before the waiter listened, or lost with a
#: connection).
FEED_STRETCH = 4


class Nap(Command):
    """Sleep until the scope may have changed: ``seconds`` at most (``FEED_STRETCH`` times
    that when the store has a change feed, but never past ``left``), less when the store's
    feed announces the scope (``wait_for_change``; on the event loop only an async store's
    coroutine twin — a sync store's blocking wait would hold an executor thread)."""

    __slots__ = ("left", "scope", "seconds")

    def __init__(self, scope: Scope, seconds: float, left: float) -> None:
        self.scope = scope
        self.seconds = seconds
        self.left = left

    def sync(self, engine: Runtime) -> None:
        waiter = getattr(engine.store, "wait_for_change", None)
        if waiter is None:
            time.sleep(min(self.seconds, self.left))
        else:
            waiter(self.scope, timeout=min(self.seconds * FEED_STRETCH, self.left))

    async def run_async(self, engine: Runtime) -> None:
        waiter = getattr(engine.store, "wait_for_change", None)
        if waiter is None or not engine.io.native_async:
            await asyncio.sleep(min(self.seconds, self.left))
        else:
            await waiter(self.scope, timeout=min(self.seconds * FEED_STRETCH, self.left))


class Announce(Command):
    """Wake the waiters of a scope whose attempt's outcome was just written, when the store
    has a change feed (``announce_change``).  Returns the store's error instead of raising
    it: a lost announcement only makes the waiters look again at their nap's end."""

    __slots__ = ("scope",)

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def sync(self, engine: Runtime) -> Exception | None:
        announce = getattr(engine.store, "announce_change", None)
        if announce is None:
            return None
        try:
            announce(self.scope)
        except Exception as exc:  # handed to the flow, which logs it
            return exc
        return None

    async def run_async(self, engine: Runtime) -> Exception | None:
        announce = getattr(engine.store, "announce_change", None)
        if announce is None:
            return None
        try:
            if engine.io.native_async:
                await announce(self.scope)
            else:
                await engine.offloader.run(announce, self.scope)
        except Exception as exc:  # handed to the flow, which logs it
            return exc
        return None


__all__ = ["DEFAULT_MAX_WAITERS", "FEED_STRETCH", "Announce", "Nap", "Waiters"]
