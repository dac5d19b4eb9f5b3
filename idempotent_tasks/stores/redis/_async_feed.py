"""The async Redis store's change feed: ``_feed`` on ``redis.asyncio``.

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

from ..._core.logging import default_logger
from ._feed import RECONNECT_MIN, next_nap

#: Seconds one read of the listener may block (it loops; ``close()`` cancels it sooner).
LISTEN_READ: Final = 10.0

_log = default_logger()


class _LoopFeed:
    """The waiters of one store on one event loop, and the task that wakes them."""

    def __init__(self) -> None:
        self.waiters: dict[str, set[asyncio.Event]] = {}
        #: Set while the server has confirmed the current subscription.
        self.subscribed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.lost = False  # a subscription was lost since the last one

    def dispatch(self, message: dict[str, Any]) -> bool:
        """Wake the waiters of an announced digest; True for the subscription's
        confirmation."""
        kind = message.get("type")
        if kind == "subscribe":
            if self.lost:  # announcements may have been lost meanwhile: everyone looks again
                self.lost = False
                self.wake_all()
            self.subscribed.set()
            return True
        data = message.get("data")
        if kind == "message" and isinstance(data, bytes | str):
            digest = data.decode() if isinstance(data, bytes) else data
            for event in self.waiters.get(digest, ()):
                event.set()
        return False

    def wake_all(self) -> None:
        """A false wake-up for every waiter (allowed: it costs each one more look)."""
        for waiting in self.waiters.values():
            for event in waiting:
                event.set()


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
        feed.waiters.setdefault(digest, set()).add(event)
        try:
            async with asyncio.timeout(timeout):
                await feed.subscribed.wait()  # the first wait blocks once subscribed
                await event.wait()
        except TimeoutError:
            pass
        finally:
            waiting = feed.waiters[digest]
            waiting.discard(event)
            if not waiting:
                del feed.waiters[digest]
        return event.is_set()

    def pending(self, digest: str) -> int:
        """How many waiters of ``digest`` are registered and not woken yet (on any loop)."""
        return sum(
            not event.is_set()
            for feed in list(self._loops.values())
            for event in list(feed.waiters.get(digest, ()))
        )

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
                feed.subscribed.clear()
                feed.lost = True
                _log.warning("change_feed_lost", channel=self.channel,
                             error=type(exc).__name__, retry_in=nap)  # fmt: skip
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
