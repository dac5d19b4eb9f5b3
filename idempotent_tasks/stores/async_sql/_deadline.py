"""AsyncSQLStore's statement deadline: one timer per store, not one per statement.

A statement on a link that went silent (a partition, a stuck proxy) would wait until TCP
gives up, minutes later.  The store arms this watchdog around every plan it runs; one
``loop.call_at`` timer sits on the oldest statement in flight, and when a statement is
older than ``socket_timeout`` its connection is broken through the driver's public means
(the transport's ``break_``: psycopg's socket shut down, asyncpg's ``terminate()``), so the
awaited call fails at once and the store fails closed.  Arming costs a set insertion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ._transports import Held


class Watchdog:
    """The statements' deadline (see the module docstring)."""

    __slots__ = ("_break", "_busy", "_timer", "timeout")

    def __init__(self, timeout: float, break_: Callable[[Any], None]) -> None:
        self.timeout = timeout
        self._break = break_
        self._busy: set[Held] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, held: Held) -> None:
        loop = asyncio.get_running_loop()
        held.started = now = loop.time()
        self._busy.add(held)
        if self._timer is None:
            self._timer = loop.call_at(now + self.timeout, self._fire, loop)

    def stop(self, held: Held) -> None:
        self._busy.discard(held)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now, timeout, soonest = loop.time(), self.timeout, None
        for held in list(self._busy):
            deadline = held.started + timeout
            if deadline <= now:
                self._busy.discard(held)
                held.fired = True
                self._break(held.conn)  # its wait wakes up and fails at once
            elif soonest is None or deadline < soonest:
                soonest = deadline
        if soonest is not None:
            self._timer = loop.call_at(soonest, self._fire, loop)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._busy.clear()


__all__ = ["Watchdog"]
