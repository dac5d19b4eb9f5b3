"""What both broker loops share: retry backoff, stop signals, background maintenance."""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.runner import MaintenanceRunner, MaintenanceSchedule
from ._message import Message

DEFAULT_RETRY_BACKOFF = (0.5, 30.0)

#: ``on_outcome=`` of a loop: called with each message and its outcome, before the loop
#: acts on it (metrics, tests, audit).  It must not raise.
OutcomeCallback = Callable[[Message, Outcome], None]

#: ``maintenance=`` of a loop: ``True`` (default schedule), ``False``/``None`` (off: run
#: recovery and cleanup elsewhere, e.g. ``idempotent-tasks recover`` from cron), or a schedule.
MaintenanceOption = bool | MaintenanceSchedule | None


class Backoff:
    """Exponential backoff with full jitter in its upper half: attempt ``n`` (from 0) waits
    between half and all of ``min(max_s, initial_s * 2**n)`` seconds, so that many consumers
    retrying the same outage do not come back in lockstep."""

    def __init__(self, retry_backoff: tuple[float, float]) -> None:
        initial, maximum = (float(v) for v in retry_backoff)
        if initial <= 0 or maximum < initial:
            raise ConfigurationError(
                "retry_backoff must be (initial_s, max_s) with 0 < initial_s <= max_s"
            )
        self.initial = initial
        self.maximum = maximum

    def delay(self, attempt: int) -> float:
        ceiling = min(self.maximum, self.initial * 2 ** min(attempt, 32))
        return float(ceiling * random.uniform(0.5, 1.0))


def install_signal_handlers(
    stop: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
) -> bool:
    """Set ``stop`` on SIGTERM/SIGINT so a consumer process shuts down cleanly: the message
    in hand finishes, its offset / ack is written, the group is left.  Only possible in the
    main thread; returns False (and changes nothing) elsewhere.

    Args:
        stop: The event the consumer loop's ``run(fn, stop=...)`` watches.
        signals: The signals that set it.

    Returns:
        True if the handlers were installed (main thread), False otherwise.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    signalled = False

    def handle(signum: int, frame: FrameType | None) -> None:
        # A handler runs between two bytecodes of the main thread, which may hold the event's
        # lock right then: inside ``stop.wait()``, or inside this very handler's ``set()`` when
        # a second SIGTERM arrives.  Setting it here would deadlock: set it once, from a thread.
        nonlocal signalled
        if signalled:
            return
        signalled = True
        threading.Thread(target=stop.set, name="idempotent-tasks-stop", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handle)
    return True


def resolve_stop(stop: threading.Event | None) -> threading.Event:
    """``run(fn)`` without ``stop`` runs as a process would: until SIGTERM / SIGINT."""
    if stop is not None:
        return stop
    event = threading.Event()
    install_signal_handlers(event)
    return event


@contextmanager
def maintenance(handler: IdempotencyHandler, option: MaintenanceOption) -> Iterator[None]:
    """Run recovery and cleanup in a background thread while the loop runs, with a store
    lease so that one consumer of the fleet runs each job at a time."""
    if option is None or option is False:
        yield
        return
    schedule = option if isinstance(option, MaintenanceSchedule) else None
    runner = MaintenanceRunner(handler, schedule)
    runner.start()
    try:
        yield
    finally:
        runner.stop()


