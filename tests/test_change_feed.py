"""The handler on a store with a change feed (``stores.changes``): an operation that waits
announces its outcome and its duplicates sleep on the feed; the default path never touches
it.  The memory store's feed (in-process) stands for PostgreSQL's and Redis's here; their
own feeds are checked by the store contract and by their store tests."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyHandler, MemoryStore, SQLStore, create_logger_adapter
from idempotent_tasks.stores import ChangeFeedStore, Scope
from idempotent_tasks.testing import FakeClock

from ._every_store import SCOPE, Body, Events, Held, Waiter
from ._wait import budget

WAITING = {"on_in_progress": "wait", "wait_timeout": 30.0}
S = Scope(SCOPE["tenant"], SCOPE["operation"], SCOPE["key"])


class Spy:
    """What a store's feed was asked: the scopes announced, the timeouts waited with."""

    def __init__(self) -> None:
        self.announced: list[Scope] = []
        self.waits: list[float] = []
        self.waiting = threading.Event()
        self.refuse = False


class FeedSpy(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.spy = Spy()

    def announce_change(self, scope: Scope) -> None:
        if self.spy.refuse:
            raise ConnectionError("the feed is down")
        self.spy.announced.append(scope)
        super().announce_change(scope)

    def wait_for_change(self, scope: Scope, *, timeout: float) -> bool:
        self.spy.waits.append(timeout)
        self.spy.waiting.set()
        return super().wait_for_change(scope, timeout=timeout)


def handler(store: Any, events: Events | None = None, **kw: Any) -> IdempotencyHandler:
    logger = create_logger_adapter(events) if events is not None else None
    return IdempotencyHandler(store, clock=FakeClock(), lease_timeout=30, metrics=None,
                              logger=logger, **kw)


def test_the_memory_store_has_a_change_feed() -> None:
    assert isinstance(MemoryStore(), ChangeFeedStore)


def test_the_default_policy_never_announces() -> None:
    store = FeedSpy()
    h = handler(store)
    assert h.run(Body(), **SCOPE).kind == "executed"
    assert h.run(Body(), **SCOPE).kind == "replayed"
    assert store.spy.announced == [] and store.spy.waits == []


def test_every_written_outcome_of_a_waiting_operation_is_announced() -> None:
    store = FeedSpy()
    h = handler(store, max_retries=2, **WAITING)
    assert h.run(Body(ConnectionError("transient")), **SCOPE).kind == "failed"  # released
    assert h.run(Body(ConnectionError("again")), **SCOPE).kind == "poisoned"
    assert h.run(Body(), **{**SCOPE, "key": "other"}).kind == "executed"
    assert store.spy.announced == [S, S, Scope(S.tenant, S.operation, "other")]
    assert h.run(Body(), **SCOPE).kind == "poisoned"  # a refusal writes nothing: no news
    assert len(store.spy.announced) == 3


def test_a_waiting_duplicate_sleeps_on_the_feed_and_gets_the_result() -> None:
    store, events = FeedSpy(), Events()
    h = handler(store, events, **WAITING)
    first = Held(h)
    body = Body()
    waiter = Waiter(h, body)
    assert store.spy.waiting.wait(budget(10))  # asleep on the feed, not on time.sleep
    assert first.finish().kind == "executed"
    outcome = waiter.outcome()
    assert (outcome.kind, outcome.result, body.calls) == ("replayed", "first", 0)
    assert store.spy.announced == [S]
    assert all(0 < t <= WAITING["wait_timeout"] for t in store.spy.waits)


def test_a_lost_announcement_is_logged_and_the_outcome_stands() -> None:
    store, events = FeedSpy(), Events()
    store.spy.refuse = True
    h = handler(store, events, **WAITING)
    outcome = h.run(Body("done"), **SCOPE)
    assert (outcome.kind, outcome.result) == ("executed", "done")
    assert "change_announce_failed" in events.seen
    assert h.run(Body(), **SCOPE).kind == "replayed"


def test_the_async_path_announces_through_the_executor() -> None:
    store = FeedSpy()
    h = handler(store, **WAITING)

    async def body() -> str:
        return "async"

    outcome = asyncio.run(h.run_async(body, **SCOPE))
    assert outcome.kind == "executed" and store.spy.announced == [S]


class TransactionalSpy(SQLStore):
    """A SQLite store that records announcements (SQLite itself has no feed)."""

    announced: list[Scope]

    def announce_change(self, scope: Scope) -> None:
        self.announced.append(scope)


def test_a_transactional_body_is_announced_after_its_commit(tmp_path: Path) -> None:
    store = TransactionalSpy(f"sqlite:///{tmp_path / 'feed.db'}")
    store.announced = []
    store.create_schema()
    seen: list[int] = []

    def body(conn: Any) -> str:
        seen.append(len(store.announced))  # nothing announced while the transaction runs
        return "committed"

    try:
        outcome = handler(store, **WAITING).run(body, transactional=True, **SCOPE)
        assert (outcome.kind, seen, store.announced) == ("executed", [0], [S])
    finally:
        store.close()
