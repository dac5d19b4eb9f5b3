"""One shared heartbeat per handler, renewing the lease of every running body.

A thread per execution would cost a thread start on every message; one daemon thread that
wakes every ``interval`` and renews all registered leases costs nothing on the hot path.
With an async store the heartbeat is an asyncio task instead (:class:`AsyncHeartbeat`, one
per event loop), which awaits the renewals on the loop: no thread at all.
A renewal that the store refuses means the lease was taken over: the body is told through
its :class:`Lease` (``lost``) and the final conditional write will be refused anyway.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
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


class _LoopBeats:
    """The leases registered on one event loop, and the task renewing them."""

    __slots__ = ("leases", "task")

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.task: asyncio.Task[None] | None = None


class AsyncHeartbeat:
    """Renews the leases of bodies running on event loops, every ``interval`` seconds, via
    ``await renew(lease) -> bool``: one task per loop, started by the first registration
    and ending when the loop has no lease left (so an idle loop has no heartbeat task).
    ``register`` / ``unregister`` are called on the body's own loop."""

    def __init__(self, interval: float, renew: Callable[[Lease], Awaitable[bool]]) -> None:
        self.interval = interval
        self._renew = renew
        self._ids = itertools.count()
        self._loops: dict[asyncio.AbstractEventLoop, _LoopBeats] = {}
        self._owner: dict[int, _LoopBeats] = {}

    def register(self, lease: Lease) -> int:
        loop = asyncio.get_running_loop()
        beats = self._loops.get(loop)
        if beats is None:
            beats = self._loops.setdefault(loop, _LoopBeats())
        ident = next(self._ids)
        beats.leases[ident] = lease
        self._owner[ident] = beats
        if beats.task is None:
            beats.task = loop.create_task(self._run(loop, beats), name="idempotent-tasks-heartbeat")
        return ident

    def unregister(self, ident: int) -> None:
        beats = self._owner.pop(ident, None)
        if beats is not None:
            beats.leases.pop(ident, None)

    async def _run(self, loop: asyncio.AbstractEventLoop, beats: _LoopBeats) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval)
                leases = [lease for lease in beats.leases.values() if not lease.lost.is_set()]
                if not beats.leases:
                    return
                results = await asyncio.gather(
                    *(self._renew(lease) for lease in leases), return_exceptions=True
                )
                for lease, ok in zip(leases, results, strict=True):
                    if ok is False:
                        lease.lost.set()
        finally:
            beats.task = None
            if not beats.leases:
                self._loops.pop(loop, None)

    def stop(self) -> None:
        """Cancel every loop's heartbeat task (from any thread)."""
        for loop, beats in list(self._loops.items()):
            task = beats.task
            if task is not None and not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
