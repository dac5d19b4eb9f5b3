"""The async Redis store's change feed: ``_pubsub`` on ``redis.asyncio``.

The same channel and digests as the blocking store's feed (a sync worker's announcement
wakes an async waiter and the other way round), with one listener task per store and event
loop instead of a thread: a ``redis.asyncio`` ``PubSub`` on a connection of its own, an
``asyncio.Event`` per waiter, started by the first wait on a loop, which blocks only once
the subscription is confirmed (or its timeout passes).  After a lost connection the task
naps and subscribes again on a new ``PubSub``, then wakes every waiter to look again (until
then they sleep to their timeout).  ``close()`` cancels the task (it closes its ``PubSub``)
and wakes the running loop's waiters.  A cluster client of a redis-py without
``redis.asyncio`` cluster pub/sub has no feed: its waits sleep their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any, Final

from ._pubsub import RECONNECT_MIN, Registry, next_nap

#: Seconds one read of the listener may block (it loops; ``close()`` cancels it sooner).
LISTEN_READ: Final = 10.0


class _LoopFeed(Registry[asyncio.Event]):
    """The waiters of one store on one event loop, and the task that wakes them."""

    def __init__(self) -> None:
        super().__init__(asyncio.Event(), contextlib.nullcontext())
        self.task: asyncio.Task[None] | None = None


class AsyncChangeFeed:
    """The waiters of one :class:`AsyncRedisStore` in this process, per event loop, and
    one subscription per loop that wakes them (module docstring)."""

    def __init__(self, client: Any, channel: str, errors: tuple[type[BaseException], ...]) -> None:
        self._client = client
        self.channel = channel
        self._errors = errors
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopFeed] = (
            weakref.WeakKeyDictionary()
        )

    async def wait(self, digest: str, timeout: float) -> bool:
        """Wait until ``digest`` is announced (True) or ``timeout`` seconds pass (False)."""
        if getattr(self._client, "pubsub", None) is None:
            await asyncio.sleep(timeout)
            return False
        feed = self._started(asyncio.get_running_loop())
        event = asyncio.Event()
        feed.add(digest, event)
        try:
            async with asyncio.timeout(timeout):
                await feed.subscribed.wait()  # the first wait blocks once subscribed
                await event.wait()
        except TimeoutError:
            pass
        finally:
            feed.remove(digest, event)
        return event.is_set()

    def pending(self, digest: str) -> int:
        """How many waiters of ``digest`` are registered and not woken yet (on any loop)."""
        return sum(feed.pending(digest) for feed in list(self._loops.values()))

    def subscribed(self) -> bool:
        """Whether the server has confirmed the running loop's subscription."""
        feed = self._loops.get(asyncio.get_running_loop())
        return feed is not None and feed.subscribed.is_set()

    def _started(self, loop: asyncio.AbstractEventLoop) -> _LoopFeed:
        feed = self._loops.get(loop)
        if feed is None:
            feed = self._loops[loop] = _LoopFeed()
        if feed.task is None or feed.task.done():
            feed.subscribed.clear()
            feed.task = loop.create_task(self._listen(feed))
        return feed

    async def _listen(self, feed: _LoopFeed) -> None:
        nap = RECONNECT_MIN
        while True:
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=LISTEN_READ)
                    if message is not None and feed.dispatch(message):
                        nap = RECONNECT_MIN
            except self._errors as exc:
                feed.lost_subscription(self.channel, exc, nap)
                await asyncio.sleep(nap)
                nap = next_nap(nap)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*self._errors):  # its connection is gone already
                        await pubsub.aclose()

    async def close(self) -> None:
        """Cancel every loop's listener; wait for the running loop's to finish and wake its
        waiters (they look at their records again)."""
        current = asyncio.get_running_loop()
        for loop, feed in list(self._loops.items()):
            task, feed.task = feed.task, None
            feed.subscribed.clear()
            if task is None:
                continue
            if loop is current:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                feed.wake_all()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)


__all__ = ["LISTEN_READ", "AsyncChangeFeed"]
