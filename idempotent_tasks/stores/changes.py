"""The optional store primitive behind event-driven waiting (``on_in_progress="wait"``).

A duplicate that waits for a running attempt's outcome looks at the scope's record, naps,
and looks again.  Without help from the store the naps are a doubling backoff (a few
milliseconds up to a quarter of a second).  A store that can carry a signal between
processes — PostgreSQL ``LISTEN``/``NOTIFY``, Redis pub/sub, or the memory store's
condition variable — implements this protocol, and the waiter then sleeps until the scope
changes (or a long nap's end, as a safety net) instead of polling.

The rules:

* ``announce_change(scope)`` wakes every waiter of ``scope`` in every process that shares
  the store, *after* the change it announces is durable (the handler calls it once the
  outcome of an attempt is written: SUCCESS, FAILED, a release, UNCERTAIN).  It is called
  only for operations whose policy is ``on_in_progress="wait"``, so the default path pays
  nothing.  It never raises for a lost signal: a waiter that misses one wakes at its nap's
  end and looks again; it may raise a store error (the handler logs it and goes on).
* ``wait_for_change(scope, timeout=...)`` blocks until an ``announce_change(scope)`` made
  after the call started, or ``timeout`` seconds: ``True`` when woken by an announcement,
  ``False`` at the timeout.  Announcements for other scopes may wake it too (a false
  wake-up costs the waiter one extra look at the record, nothing else).  Waiters share the
  store's listening resources (one connection or subscription per store and process, not
  one per waiter).
* Both are safe to call from any thread (the async twins: from the store's event loop).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._core.records import Scope


@runtime_checkable
class ChangeFeedStore(Protocol):
    """A store that can wake the waiters of a scope when it changes (module docstring)."""

    def announce_change(self, scope: Scope) -> None:
        """Wake ``scope``'s waiters in every process sharing the store."""
        ...

    def wait_for_change(self, scope: Scope, *, timeout: float) -> bool:
        """Block until ``scope`` is announced (True) or ``timeout`` seconds pass (False)."""
        ...


@runtime_checkable
class AsyncChangeFeedStore(Protocol):
    """:class:`ChangeFeedStore` with coroutine methods."""

    async def announce_change(self, scope: Scope) -> None: ...

    async def wait_for_change(self, scope: Scope, *, timeout: float) -> bool: ...


__all__ = ["AsyncChangeFeedStore", "ChangeFeedStore"]
