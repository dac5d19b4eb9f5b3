"""What every rule of the contract builds on: a fixed clock, one scope, claims, races."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from .._core.records import CreateResult, Scope
from ..stores.base import Store

T = TypeVar("T")

#: The handler's clock as the rules pass it in: stores never read a clock of their own.
NOW = 1_700_000_000.0
LEASE = NOW + 30
S = Scope("acme", "payments.charge", "k-1")
#: Threads (on an async store: concurrent coroutines) in every race.
RACERS = 8
#: Seconds any racer may wait at the barrier or any call may take before the rule fails.
PATIENCE = 60.0


def claim(store: Store, scope: Scope = S, now: float = NOW, h: str = "h1") -> CreateResult:
    return store.create(scope, request_hash=h, now=now, lease_expires_at=now + 30)


def token_of(store: Store, scope: Scope = S, now: float = NOW) -> int:
    """Claim ``scope`` (it must be free) and return the new attempt's token."""
    result = claim(store, scope, now=now)
    assert result.created, result
    return result.record.fencing_token


def expire(store: Store, scope: Scope, token: int, now: float) -> None:
    """Finish the attempt ``token`` of ``scope`` with a record that has expired at ``now``."""
    assert store.mark_success(scope, token=token, response=b"1", now=now - 10, expires_at=now)


def race(call: Callable[[int], T], racers: int = RACERS) -> list[T]:
    """Run ``call(i)`` on ``racers`` threads (``i`` = 0, 1, …) released together by a
    barrier (the window is forced open, never hoped for with a sleep); the results in no
    particular order, or the first error."""
    barrier = threading.Barrier(racers)
    results: list[T] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        try:
            barrier.wait(PATIENCE)
            got = call(i)
        except BaseException as exc:  # handed to the test's thread below
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(got)

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    if errors:
        raise errors[0]
    assert len(results) == racers, f"{racers - len(results)} racer(s) never finished"
    return results
