"""An async store under the contract: its coroutines run on an event loop of its own.

The loop runs on a daemon thread for the whole test; each blocking call of the rules submits
one coroutine to it and waits.  Calls made at once from several test threads become
concurrent coroutines on that loop, interleaving at every ``await`` the store makes, so the
race rules still race.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from ._common import PATIENCE

T = TypeVar("T")


class EventLoopThread:
    """An event loop running on a daemon thread of its own until :meth:`close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="store-contract-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = PATIENCE) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(PATIENCE)
        self.loop.close()


class BlockingStore:
    """``async_store`` as a sync store: each coroutine method becomes a blocking call run
    on ``loop``; any other attribute is the async store's own."""

    def __init__(self, async_store: Any, loop: EventLoopThread) -> None:
        self.async_store = async_store
        self.loop = loop
        self.name: str = async_store.name

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.async_store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        run = self.loop.run

        def call(*args: Any, **kwargs: Any) -> Any:
            return run(attr(*args, **kwargs))

        return call

    def __repr__(self) -> str:
        return f"BlockingStore({self.async_store!r})"


@contextlib.contextmanager
def blocking(async_store: Any) -> Iterator[BlockingStore]:
    """``async_store`` on a loop of its own for one test: its schema created first; then
    dropped (``drop_schema``, when it has one) and the store closed, on that loop."""
    loop = EventLoopThread()
    try:
        loop.run(async_store.create_schema())
        try:
            yield BlockingStore(async_store, loop)
        finally:
            drop: Callable[[], Coroutine[Any, Any, None]] | None = getattr(
                async_store, "drop_schema", None
            )
            try:
                if drop is not None:
                    loop.run(drop())
            finally:
                loop.run(async_store.close())
    finally:
        loop.close()
