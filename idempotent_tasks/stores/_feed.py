"""What every change feed (``stores.changes``) shares: the per-process registry of waiters,
and the digest a scope is announced under.

A store's listener (a ``LISTEN`` connection, a pub/sub subscription, or nothing for the
memory store) receives digests and calls :meth:`Waiters.wake`; each waiting thread holds one
:class:`threading.Event` in the registry for its scope's digest.  The digest, not the
scope, crosses the wire: tenants and keys never appear in a channel payload, and the payload
has one bounded length whatever the key.
"""

from __future__ import annotations

import hashlib
import threading

from .._core.records import Scope


def scope_digest(scope: Scope) -> str:
    """A short, stable name for ``scope`` on a change feed (32 hex characters)."""
    raw = "\x00".join((scope.tenant, scope.operation, scope.key)).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class Waiters:
    """Threads waiting for a scope's announcement, by digest (thread-safe)."""

    __slots__ = ("_events", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[threading.Event]] = {}

    def wait(self, digest: str, timeout: float) -> bool:
        """Block until :meth:`wake` of ``digest`` (True) or ``timeout`` seconds (False)."""
        event = threading.Event()
        with self._lock:
            self._events.setdefault(digest, []).append(event)
        try:
            return event.wait(timeout)
        finally:
            with self._lock:
                waiting = self._events.get(digest)
                if waiting is not None and event in waiting:
                    waiting.remove(event)
                    if not waiting:
                        del self._events[digest]

    def wake(self, digest: str) -> None:
        """Wake every thread waiting for ``digest`` (none: nothing happens)."""
        with self._lock:
            events = self._events.pop(digest, ())
        for event in events:
            event.set()

    def wake_all(self) -> None:
        """Wake every waiting thread (a listener that was away may have missed announcements:
        its waiters look at their records once more)."""
        with self._lock:
            events, self._events = self._events, {}
        for waiting in events.values():
            for event in waiting:
                event.set()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._events.values())


__all__ = ["Waiters", "scope_digest"]
