"""One shared heartbeat thread per handler, renewing the lease of every running body.

A thread per execution would cost a thread start on every message; one daemon thread that
wakes every ``interval`` and renews all registered leases costs nothing on the hot path.
A renewal that the store refuses means the lease was taken over: the body is told through
its :class:`Lease` (``lost``) and the final conditional write will be refused anyway.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .records import Scope


@dataclass(slots=True)
class Lease:
    scope: Scope
    token: int
    lease_timeout: float
    lost: threading.Event = field(default_factory=threading.Event)


class HeartbeatThread:
    """Renews registered leases every ``interval`` seconds via ``renew(lease) -> bool``."""

    def __init__(self, interval: float, renew: Callable[[Lease], bool]) -> None:
        self.interval = interval
        self._renew = renew
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, lease: Lease) -> int:
        with self._lock:
            ident = next(self._ids)
            self._leases[ident] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idempotent-tasks-heartbeat", daemon=True
                )
                self._thread.start()
            return ident

    def unregister(self, ident: int) -> None:
        with self._lock:
            self._leases.pop(ident, None)

    def _run(self) -> None:
        while not self._wake.wait(self.interval):
            with self._lock:
                leases = list(self._leases.values())
                if not leases:
                    self._thread = None
                    return
            for lease in leases:
                if lease.lost.is_set():
                    continue
                if not self._renew(lease):
                    lease.lost.set()

    def stop(self) -> None:
        self._wake.set()
