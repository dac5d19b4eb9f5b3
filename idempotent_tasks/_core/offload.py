"""The thread-hop path's own bounded executor: where ``run_async`` runs a *sync* store's calls.

With a synchronous store (``SQLStore``, ``RedisStore``, ``MemoryStore``) a coroutine body
cannot await its store calls, so each one runs on a worker thread.  They run on this
executor, never on the event loop's default one (``asyncio.to_thread``): the loop's default
pool is shared with everything else in the process and sized ``min(32, cpu + 4)`` — six
threads on a 2-core machine — so a burst of requests would queue behind unrelated work, and
unrelated work behind the store.  Here the size is the handler's ``async_executor_threads``
(default :data:`DEFAULT_ASYNC_EXECUTOR_THREADS`): at most that many store calls are in
flight at once from the handler's coroutines; further calls wait for a free thread.

With an async store (``AsyncSQLStore``, ``AsyncRedisStore``) nothing runs here: the engine
awaits the store on the loop itself, and this executor is never even created.

The executor is built on first use and rebuilt in a forked child (a parent's threads do not
survive ``fork``); the context variables of the caller travel with every call.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from .errors import ConfigurationError

#: Threads of a handler's own executor for a sync store's calls on the async path.
DEFAULT_ASYNC_EXECUTOR_THREADS: Final = 16
THREAD_NAME_PREFIX: Final = "idempotent-tasks-io"

T = TypeVar("T")


class Offloader:
    """Runs blocking calls from coroutines on a bounded pool of ``threads`` threads."""

    __slots__ = ("_executor", "_lock", "_pid", "threads")

    def __init__(self, threads: int) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigurationError("async_executor_threads must be an integer >= 1")
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def executor(self) -> ThreadPoolExecutor:
        executor = self._executor
        if executor is None or self._pid != os.getpid():
            with self._lock:
                executor = self._executor
                if executor is None or self._pid != os.getpid():
                    executor = self._executor = ThreadPoolExecutor(
                        max_workers=self.threads, thread_name_prefix=THREAD_NAME_PREFIX
                    )
                    self._pid = os.getpid()
        return executor

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, with the caller's context variables."""
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor(), context.run, fn, *args)

    def shutdown(self) -> None:
        """Let the worker threads end once their calls are done (a later call starts anew)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


__all__ = ["DEFAULT_ASYNC_EXECUTOR_THREADS", "THREAD_NAME_PREFIX", "Offloader"]
