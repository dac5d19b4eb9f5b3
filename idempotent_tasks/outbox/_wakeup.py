"""How a relay waits for the next batch: PostgreSQL ``LISTEN`` (woken by the ``pg_notify``
of every staging transaction, at its commit) or plain polling.

Notifications only shorten the wait, they never replace the poll: a relay that was
reconnecting when a transaction committed misses its notification, and the next poll picks
the rows up.  ``wake()`` ends a wait at once (``stop()``), whatever the waiter.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Protocol

_SLICE = 0.25  # seconds: how long a LISTEN wait may block before it looks at wake()


class Waiter(Protocol):
    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when a notification (or ``wake``) ended it."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


class PollWaiter:
    def __init__(self) -> None:
        self._woken = threading.Event()

    def wait(self, timeout: float) -> bool:
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        return None


class ListenWaiter:
    """``LISTEN "<prefix>_outbox"`` on a connection of its own (detached from the pool)."""

    def __init__(self, engine: Any, channel: str, log: Any) -> None:
        self._engine = engine
        self._channel = channel
        self._log = log
        self._conn: Any = None
        self._woken = threading.Event()
        self.listening = False
        self._warned = False

    def _connect(self) -> Any:
        raw = self._engine.raw_connection()
        conn = raw.driver_connection
        raw.detach()  # ours for good: it stays in LISTEN mode
        conn.autocommit = True
        quoted = '"' + self._channel.replace('"', '""') + '"'
        conn.execute(f"LISTEN {quoted}")
        self.listening, self._warned = True, False
        return conn

    def wait(self, timeout: float) -> bool:
        remaining = timeout
        while remaining > 0 and not self._woken.is_set():
            step = min(_SLICE, remaining)
            try:
                if self._conn is None:
                    self._conn = self._connect()
                notified = False
                for _ in self._conn.notifies(timeout=step, stop_after=1):
                    notified = True
                if notified:
                    self._drain()
                    return True
            except Exception as exc:  # the server went away: poll until it is back
                self._lost(exc)
                self._woken.wait(step)
            remaining -= step
        woken = self._woken.is_set()
        self._woken.clear()
        return woken

    def _drain(self) -> None:
        """Notifications of other commits already queued: one batch serves them all."""
        for _ in self._conn.notifies(timeout=0.0):
            pass

    def _lost(self, exc: BaseException) -> None:
        """Logged once per outage (the relay keeps polling meanwhile)."""
        if self.listening or not self._warned:
            self._log.warning("outbox_listen_lost", error=f"{type(exc).__name__}: {exc}")
            self._warned = True
        self.listening = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self.listening = False
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


__all__ = ["ListenWaiter", "PollWaiter", "Waiter"]
