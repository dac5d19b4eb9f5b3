"""Helpers for users' own tests: a controllable clock, a store that fails on demand, and a
claim abandoned as a crashed worker leaves it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._core.drivers import drive
from ._core.errors import StoreUnavailableError
from ._core.flow import claim_scope
from ._core.handler import IdempotencyHandler
from ._core.outcome import Outcome
from .stores.base import Store


class FakeClock:
    """An injectable clock (``IdempotencyHandler(clock=...)``) that moves only when told."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FaultyStore:
    """Wraps a store; calls named in ``failing`` raise ``StoreUnavailableError``.

    ``before`` hooks run before the named call (e.g. to block on an event and force a race
    window deterministically).
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.name = inner.name
        self.failing: set[str] = set()
        self.before: dict[str, Callable[[], None]] = {}
        self.calls: list[str] = []

    def fail(self, *names: str) -> None:
        self.failing.update(names)

    def heal(self) -> None:
        self.failing.clear()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            hook = self.before.get(name)
            if hook is not None:
                hook()
            if name in self.failing or "*" in self.failing:
                raise StoreUnavailableError(f"injected failure in {name}")
            return attr(*args, **kwargs)

        return call


def simulate_crash(
    handler: IdempotencyHandler,
    *,
    operation: str,
    tenant: str,
    key: str,
    payload: Any = None,
    lease_timeout: float | None = None,
) -> int | Outcome:
    """Claim a scope as a worker that dies right after its claim would: the record stays
    PROCESSING with the returned fencing token until its lease expires, and then recovery or
    the next delivery's takeover counts the crashed attempt.  When the scope cannot be
    claimed, the :class:`Outcome` a delivery got instead (a replay or a refusal)."""
    call = handler.prepare(operation, tenant, key, payload, True, lease_timeout=lease_timeout)
    assert call is not None
    claimed = drive(handler, claim_scope(handler, call))
    return claimed if isinstance(claimed, Outcome) else claimed.token
