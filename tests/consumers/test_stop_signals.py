"""The loops' SIGTERM/SIGINT handler never blocks on the stop event's lock.

A Python signal handler runs in the main thread between two bytecodes, so the main thread may
hold the event's lock right then: inside ``stop.wait()`` (the RabbitMQ loop's reconnect
backoff), or inside the handler's own ``stop.set()`` when a second SIGTERM follows the first
(a supervisor that signals twice).  A handler that called ``stop.set()`` there deadlocked the
process for good: seen as a Kafka consumer that never exited after two SIGTERMs, its main
thread in ``handle -> Event.set`` twice over.  The window is forced here by holding the lock
while the handler runs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from idempotent_tasks.consumers import install_signal_handlers


@pytest.fixture
def handler() -> Iterator[tuple[threading.Event, object]]:
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    assert install_signal_handlers(stop)  # pytest runs tests in the main thread
    try:
        yield stop, signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def test_a_signal_while_the_event_lock_is_held_does_not_block(
    handler: tuple[threading.Event, object],
) -> None:
    stop, handle = handler
    assert callable(handle)
    returned = threading.Event()

    def deliver() -> None:  # the handler, as the interpreter runs it, twice
        handle(signal.SIGTERM, None)
        handle(signal.SIGTERM, None)
        returned.set()

    with stop._cond:  # type: ignore[attr-defined]  # the lock Event.set() and wait() take
        thread = threading.Thread(target=deliver, daemon=True)
        thread.start()
        assert returned.wait(10), "the signal handler blocked on the stop event's lock"
        assert not stop.is_set()  # not yet: it is set once the lock is free
    assert stop.wait(10)
    thread.join(10)


def test_sigterm_sets_the_stop_event(handler: tuple[threading.Event, object]) -> None:
    stop, _ = handler
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)  # a second one is harmless
    assert stop.wait(10)
