"""What the policy and effects tests share: a store of every kind (sync, and async through
``run_async``), a handler over it, a body that counts its calls, a first delivery held open
with events, and the handler's log events to wait on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, create_logger_adapter
from idempotent_tasks.testing import FakeClock

from ._async_stores import (
    ASYNC_STORE_KINDS,
    HandlerFacade,
    is_async,
    loop_of,
)
from ._wait import budget
from .conftest import STORE_KINDS, store_of_kind

SCOPE = {"operation": "reports.build", "tenant": "acme", "key": "r-1"}


@pytest.fixture(params=STORE_KINDS + ASYNC_STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with store_of_kind(request.param, tmp_path, "pol") as made:
        yield made


class Events:
    """The handler's log events, and a way to wait for one (``duplicate_waiting``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, level: str, message: str, fields: dict[str, Any]) -> None:
        with self._cond:
            self.seen.append(message)
            self._cond.notify_all()

    def wait_for(self, message: str, count: int = 1) -> None:
        with self._cond:
            assert self._cond.wait_for(
                lambda: self.seen.count(message) >= count, budget(10)
            ), f"no {message!r} logged"


def make_handler(store: Any, clock: FakeClock, events: Events | None = None, **kw: Any) -> Any:
    logger = create_logger_adapter(events) if events is not None else None
    h = IdempotencyHandler(store, clock=clock, lease_timeout=30, ttl=3600, metrics=None,
                           logger=logger, **kw)
    return HandlerFacade(h, loop_of(store)) if is_async(store) else h


class Body:
    def __init__(self, result: Any = "built") -> None:
        self.calls = 0
        self.result = result

    def __call__(self) -> Any:
        self.calls += 1
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class Held:
    """A first delivery whose body runs until ``finish()``: its scope stays PROCESSING."""

    def __init__(self, h: Any, outcome: Any = "first", **kw: Any) -> None:
        started, self._go = threading.Event(), threading.Event()
        self.outcomes: list[Any] = []

        def body() -> Any:
            started.set()
            assert self._go.wait(budget(10))
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        self._thread = threading.Thread(
            target=lambda: self.outcomes.append(h.run(body, **{**SCOPE, **kw}))
        )
        self._thread.start()
        assert started.wait(budget(10))

    def finish(self) -> Any:
        self._go.set()
        self._thread.join(budget(10))
        return self.outcomes[0]


class Waiter:
    """A duplicate delivery in a thread of its own (it may wait)."""

    def __init__(self, h: Any, body: Body, **kw: Any) -> None:
        self.outcomes: list[Any] = []
        self._thread = threading.Thread(
            target=lambda: self.outcomes.append(h.run(body, **{**SCOPE, **kw}))
        )
        self._thread.start()

    def outcome(self) -> Any:
        self._thread.join(budget(30))
        assert not self._thread.is_alive(), "the waiter never returned"
        return self.outcomes[0]
