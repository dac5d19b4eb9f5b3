"""What the algorithm asks of the outside world, one small object per kind of I/O.

The flow (:mod:`.flow`) is a generator: it ``yield``s a command and gets back its result (or
has the command's exception thrown into it).  Each command knows how to run itself on the
synchronous path (``sync``) and on an event loop (``run_async``), so the two drivers in
:mod:`.drivers` are a few lines each and the algorithm is written once — the separation of
protocol from I/O that h11 and h2 use.

On the event loop nothing blocks: an async store's calls (and its body transaction) are
awaited on the loop, with no thread hop; a sync store's calls, and a cache that may block,
run on the handler's bounded executor (:mod:`.offload`); an in-process cache
(``MemoryCache``) is called inline.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from .context import CURRENT_CONTEXT
from .heartbeat import Lease
from .records import IdempotencyContext, LazyCountContext

if TYPE_CHECKING:
    from ..caches.base import Cache
    from ..stores.base import Store
    from .heartbeat import AsyncHeartbeat, HeartbeatThread
    from .instrumented import InstrumentedStore
    from .offload import Offloader


class Runtime(Protocol):
    """What a command runs on: the engine's runtime services (the engine satisfies it; the
    commands need nothing else of it)."""

    @property
    def store(self) -> Store: ...

    @property
    def cache(self) -> Cache | None: ...

    @property
    def cache_mode(self) -> str: ...

    @property
    def io(self) -> InstrumentedStore: ...

    @property
    def offloader(self) -> Offloader: ...

    @property
    def heartbeat(self) -> HeartbeatThread | AsyncHeartbeat | None: ...


class Command:
    """One step of I/O.  ``sync`` runs it here; ``run_async`` on the running event loop."""

    __slots__ = ()

    def sync(self, engine: Runtime) -> Any:
        raise NotImplementedError

    async def run_async(self, engine: Runtime) -> Any:
        """By default, ``sync`` on the handler's executor (never on the loop's thread)."""
        return await engine.offloader.run(self.sync, engine)


class Sleep(Command):
    """Back off before an outcome write is tried again."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def sync(self, engine: Runtime) -> None:
        time.sleep(self.seconds)

    async def run_async(self, engine: Runtime) -> None:
        await asyncio.sleep(self.seconds)


class CacheGet(Command):
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def sync(self, engine: Runtime) -> bytes | None:
        assert engine.cache is not None
        return engine.cache.get(self.key)

    async def run_async(self, engine: Runtime) -> bytes | None:
        mode = engine.cache_mode
        if mode == "inline":
            return self.sync(engine)
        if mode == "async":
            value: bytes | None = await engine.cache.get(self.key)  # type: ignore[misc,union-attr]
            return value
        return await engine.offloader.run(self.sync, engine)


class CachePut(Command):
    __slots__ = ("key", "ttl", "value")

    def __init__(self, key: str, value: bytes, ttl: float) -> None:
        self.key = key
        self.value = value
        self.ttl = ttl

    def sync(self, engine: Runtime) -> None:
        assert engine.cache is not None
        engine.cache.set(self.key, self.value, self.ttl)

    async def run_async(self, engine: Runtime) -> None:
        mode = engine.cache_mode
        if mode == "inline":
            self.sync(engine)
        elif mode == "async":
            await engine.cache.set(self.key, self.value, self.ttl)  # type: ignore[misc,union-attr]
        else:
            await engine.offloader.run(self.sync, engine)


def run_body(
    engine: Runtime,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    context: IdempotencyContext,
    lease: Lease | None,
) -> Any:
    """``fn(*args)`` on this thread with ``context`` bound and ``lease`` kept alive by the
    heartbeat (``RunBody`` on the synchronous path, and the flat path's body)."""
    reset = CURRENT_CONTEXT.set(context)
    heartbeat, ident = engine.heartbeat, None
    if heartbeat is not None and lease is not None:
        ident = heartbeat.register(lease)
    try:
        return fn(*args)
    finally:
        CURRENT_CONTEXT.reset(reset)
        if ident is not None:
            heartbeat.unregister(ident)  # type: ignore[union-attr]


class RunBody(Command):
    """The user's body, with its context bound and its lease kept alive while it runs."""

    __slots__ = ("args", "context", "fn", "lease")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: IdempotencyContext | None,
        lease: Lease | None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.context = context
        self.lease = lease

    def sync(self, engine: Runtime) -> Any:
        if self.context is None:
            return self.fn(*self.args)
        return run_body(engine, self.fn, self.args, self.context, self.lease)

    async def run_async(self, engine: Runtime) -> Any:
        context = self.context
        if context is None:
            return await self.fn(*self.args)
        if isinstance(context, LazyCountContext):
            context.bind_loop(asyncio.get_running_loop())
        reset = CURRENT_CONTEXT.set(context)
        heartbeat, ident = engine.heartbeat, None
        if heartbeat is not None and self.lease is not None:
            ident = heartbeat.register(self.lease)
        try:
            return await self.fn(*self.args)
        finally:
            CURRENT_CONTEXT.reset(reset)
            if ident is not None:
                heartbeat.unregister(ident)  # type: ignore[union-attr]


class TxBegin(Command):
    """Open the store's body transaction; the result is the open context manager and its
    transaction (``TxEnd`` closes it)."""

    __slots__ = ()

    def sync(self, engine: Runtime) -> tuple[AbstractContextManager[Any], Any]:
        cm = engine.store.body_transaction()  # type: ignore[attr-defined]
        return cm, cm.__enter__()

    async def run_async(self, engine: Runtime) -> tuple[Any, Any]:
        if not engine.io.native_async:
            return await engine.offloader.run(self.sync, engine)
        cm = engine.store.body_transaction()  # type: ignore[attr-defined]
        return cm, await cm.__aenter__()


class TxCall(Command):
    """``tx.<name>(*args, **kwargs)`` on the open body transaction (it translates its own
    driver errors, like a store)."""

    __slots__ = ("args", "kwargs", "name", "tx")

    def __init__(self, tx: Any, name: str, *args: Any, **kwargs: Any) -> None:
        self.tx = tx
        self.name = name
        self.args = args
        self.kwargs = kwargs

    def sync(self, engine: Runtime) -> Any:
        return getattr(self.tx, self.name)(*self.args, **self.kwargs)

    async def run_async(self, engine: Runtime) -> Any:
        if not engine.io.native_async:
            return await engine.offloader.run(self.sync, engine)
        result = self.sync(engine)  # an async transaction's methods are coroutines
        return await result if inspect.isawaitable(result) else result


class TxEnd(Command):
    """Leave the body transaction's context manager (rolls back what was not committed and
    returns the connection)."""

    __slots__ = ("cm", "error")

    def __init__(self, cm: AbstractContextManager[Any], error: BaseException | None) -> None:
        self.cm = cm
        self.error = error

    def sync(self, engine: Runtime) -> None:
        exc = self.error
        if exc is None:
            self.cm.__exit__(None, None, None)
        else:
            self.cm.__exit__(type(exc), exc, exc.__traceback__)

    async def run_async(self, engine: Runtime) -> None:
        if not engine.io.native_async:
            await engine.offloader.run(self.sync, engine)
            return
        cm: Any = self.cm
        exc = self.error
        if exc is None:
            await cm.__aexit__(None, None, None)
        else:
            await cm.__aexit__(type(exc), exc, exc.__traceback__)


__all__ = [
    "CacheGet",
    "CachePut",
    "Command",
    "RunBody",
    "Runtime",
    "Sleep",
    "TxBegin",
    "TxCall",
    "TxEnd",
]
