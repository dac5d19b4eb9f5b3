"""Many callers released at once by one barrier: the race tests' common harness."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from tests._wait import budget

T = TypeVar("T")


def at_once(callers: int, call: Callable[[], T], timeout: float = 60.0) -> list[T]:
    """Run ``call`` on ``callers`` threads that all start it together (one
    ``threading.Barrier``); their results, or the first exception one of them raised."""
    barrier = threading.Barrier(callers, timeout=budget(timeout))
    results: list[T] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        try:
            result = call()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=run) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(budget(timeout))
    if errors:
        raise errors[0]
    assert len(results) == callers, "a caller never returned"
    return results
