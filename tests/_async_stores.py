"""The async stores in the one contract suite: a loop of their own, and thin adapters.

* ``LoopThread``: an event loop on a background thread (``StoreContract``'s own, which runs
  the store contract on the async stores the same way); an async store (its pool) lives on
  it for the whole test, and the test's own thread submits coroutines to it.
* ``HandlerFacade``: the handler contract is written against ``handler.execute``; on an
  async store the facade runs every call through the **async** face instead
  (``execute_async``, ``run_many_async``, ``get_record_async``, …) on the store's loop.
  A test body is a plain function that may block on events: the facade wraps it in a
  coroutine that runs it on a worker thread (``asyncio.to_thread``, in the test, never in
  the library), so the loop stays free for the library's own calls — the heartbeat task,
  concurrent deliveries, and the body's own ``current_context().retry_count`` (read from
  that worker thread, which the library answers on the loop).
* ``AsyncFaultyStore``: ``FaultyStore`` for a store whose methods are coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from idempotent_tasks import Abandon, IdempotencyHandler, Outcome, current_context
from idempotent_tasks._core.errors import StoreUnavailableError
from idempotent_tasks._store_contract._face import EventLoopThread
from idempotent_tasks.testing import simulate_crash

from ._services import POSTGRES_URL, REDIS_URL, require

ASYNC_STORE_KINDS = ["async_postgres", "async_redis"]
#: An event loop running on its own daemon thread until ``close()``.
LoopThread = EventLoopThread
_LOOPS: weakref.WeakKeyDictionary[Any, LoopThread] = weakref.WeakKeyDictionary()


def asyncpg_url(url: str) -> str:
    """The same server through asyncpg (``postgresql+asyncpg://``)."""
    return url.replace("postgresql+psycopg://", "postgresql+asyncpg://", 1)


def new_async_store(kind: str, prefix: str) -> Any:
    """An async store of ``kind`` under ``prefix``, not yet used (no loop, no schema)."""
    if kind in ("async_postgres", "async_postgres_asyncpg"):
        require("postgres")
        from idempotent_tasks import AsyncSQLStore

        url = POSTGRES_URL if kind == "async_postgres" else asyncpg_url(POSTGRES_URL)
        return AsyncSQLStore(url, table_prefix=prefix)
    if kind == "async_redis":
        require("redis")
        from idempotent_tasks import AsyncRedisStore

        return AsyncRedisStore(REDIS_URL, prefix=prefix)
    raise ValueError(kind)


def make_async_store(kind: str, prefix: str, loop: LoopThread) -> Any:
    """A fresh async store of ``kind`` under ``prefix``, its schema created, bound to ``loop``."""
    store = new_async_store(kind, prefix)
    loop.run(store.create_schema())
    _LOOPS[store] = loop
    return store


def drop_async_store(store: Any) -> None:
    loop = loop_of(store)
    try:
        loop.run(store.drop_schema())
    finally:
        loop.run(store.close())


@contextlib.contextmanager
def async_store_on_a_loop(kind: str, prefix: str) -> Iterator[tuple[Any, LoopThread]]:
    """An async store of ``kind`` on a loop thread of its own; dropped, and the loop closed,
    afterwards."""
    loop = LoopThread()
    try:
        inner = make_async_store(kind, prefix, loop)
        try:
            yield inner, loop
        finally:
            drop_async_store(inner)
    finally:
        loop.close()


def loop_of(store: Any) -> LoopThread:
    while store not in _LOOPS and hasattr(store, "inner"):
        store = store.inner
    return _LOOPS[store]


def is_async(store: Any) -> bool:
    """An async store: its methods are coroutines (the ``AsyncStore`` Protocol)."""
    return inspect.iscoroutinefunction(getattr(store, "create", None))


class AsyncFaultyStore:
    """``FaultyStore`` for an async store: calls named in ``failing`` raise
    ``StoreUnavailableError``; ``before`` hooks run first (synchronously)."""

    def __init__(self, inner: Any) -> None:
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
        if not inspect.iscoroutinefunction(attr):
            return attr  # e.g. body_transaction (an async context manager)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            hook = self.before.get(name)
            if hook is not None:
                hook()
            if name in self.failing or "*" in self.failing:
                raise StoreUnavailableError(f"injected failure in {name}")
            return await attr(*args, **kwargs)

        return call


def _threaded(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def body(*args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    return body


class HandlerFacade:
    """``handler.execute`` & co. for the contract tests, run through the async face."""

    def __init__(self, handler: IdempotencyHandler, loop: LoopThread) -> None:
        self.handler = handler
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handler, name)

    def execute(self, fn: Callable[[], Any], **kw: Any) -> Any:
        return self.loop.run(self.handler.execute_async(_threaded(fn), **kw))

    def run(self, fn: Callable[[], Any], **kw: Any) -> Outcome:
        return self.loop.run(self.handler.run_async(_threaded(fn), **kw))

    def execute_in_transaction(self, fn: Callable[[Any], Any], **kw: Any) -> Any:
        outcome = self.loop.run(self.handler.run_async(_threaded(fn), transactional=True, **kw))
        return outcome.unwrap()

    def run_many(self, calls: Any, fn: Callable[..., Any], **kw: Any) -> list[Outcome]:
        return self.loop.run(self.handler.run_many_async(calls, _threaded(fn), **kw))

    def get_record(self, **kw: Any) -> Any:
        return self.loop.run(self.handler.get_record_async(**kw))

    def get_attempts(self, **kw: Any) -> Any:
        return self.loop.run(self.handler.get_attempts_async(**kw))

    def recover_stuck_records(self, *args: Any, **kw: Any) -> int:
        return self.loop.run(self.handler.recover_stuck_records_async(*args, **kw))

    def cleanup_expired_records(self, *args: Any, **kw: Any) -> int:
        return self.loop.run(self.handler.cleanup_expired_records_async(*args, **kw))

    def unpoison(self, **kw: Any) -> Any:
        return self.loop.run(self.handler.unpoison_async(**kw))

    def resolve(self, **kw: Any) -> Any:
        return self.loop.run(self.handler.resolve_async(**kw))

    def close(self) -> None:
        self.handler.close()


def crash(h: Any, **kw: Any) -> int | Outcome:
    """``testing.simulate_crash`` on either face: claim a scope and leave it PROCESSING (on
    the async face: a coroutine body that raises ``Abandon``, as a killed worker leaves it)."""
    if not isinstance(h, HandlerFacade):
        return simulate_crash(h, **kw)
    tokens: list[int] = []

    async def abandoned() -> None:
        token = current_context().fencing_token
        assert token is not None
        tokens.append(token)
        raise Abandon()

    try:
        outcome = h.loop.run(h.handler.run_async(abandoned, **kw))
    except Abandon:
        return tokens[0]
    return outcome
