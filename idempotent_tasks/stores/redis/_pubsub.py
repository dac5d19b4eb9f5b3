"""The Redis stores' change feed (``stores.changes``): pub/sub wakes the waiters of a scope.

* Announce: one ``PUBLISH <prefix>:changes <digest>`` on the store's transport (its errors
  translated like every other command's), where the digest is every feed's
  (``stores._feed.scope_digest``, 32 hex digits): no tenant, operation or key travels,
  and two scopes whose digests collide only wake each other (a false wake-up costs the
  waiter one extra look at the record).  The handler announces
  only for operations that wait (``on_in_progress="wait"``), once per settled attempt.
* Wait: a per-store registry maps a digest to the ``threading.Event`` of each waiter; one
  subscription per store and process (a redis-py ``PubSub`` on a connection of its own,
  read by one daemon thread) sets the events of each digest it receives.  The thread
  starts on the first wait, and that wait blocks only once the server has confirmed the
  subscription (or its timeout passes).
* Lost connection: the thread closes the ``PubSub``, naps (doubling from
  :data:`RECONNECT_MIN` to :data:`RECONNECT_MAX`, cut short by ``close()``) and subscribes
  again on a new one (redis-py's ``PubSub`` may reconnect and re-subscribe by itself on a
  later read, depending on its version and the client's retry setting, which the store
  turns off; a new ``PubSub`` depends on neither).  Announcements published meanwhile are
  lost (pub/sub keeps nothing), so once subscribed again the feed wakes every waiter to
  look at its record again (a false wake-up, which the contract allows); until then
  waiters sleep to their timeout.
* Redis Cluster: plain ``PUBLISH`` / ``SUBSCRIBE``, not sharded pub/sub.  A cluster
  forwards each ``PUBLISH`` to every node over its bus, so the one subscription (on any
  node, through ``RedisCluster.pubsub()``) hears announcements of every slot.  Sharded
  ``SPUBLISH`` would keep a message on its slot's shard, but the listener would then need
  a subscription on every master (256 shard channels) and re-subscribing when slots move,
  and the async store's cluster client offers pub/sub only in recent redis-py versions;
  the sync and async stores must hear each other on one Redis, so both use plain pub/sub.
* ``close()`` stops the thread (within :data:`POLL_INTERVAL`), which closes its
  ``PubSub``, and wakes the waiters (they look again); a later wait starts a new thread,
  and so does a forked child's first wait.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final, Generic, Protocol, TypeVar

from ..._core.logging import default_logger
from ._scripts import Plan, checked

#: Seconds the listener blocks in one read (and so at most before ``close()`` stops it).
POLL_INTERVAL: Final = 0.25
#: The listener's first and longest nap before subscribing again after an error.
RECONNECT_MIN: Final = 0.05
RECONNECT_MAX: Final = 2.0

_log = default_logger()


def feed_channel(prefix: str) -> str:
    """The store's change channel (every process sharing the prefix listens to it)."""
    return f"{prefix}:changes"


def announce_change(channel: str, digest: str) -> Plan[None]:
    """The plan of one announcement (named like the store method, for its errors)."""
    checked((yield ("PUBLISH", channel, digest)))


def next_nap(nap: float) -> float:
    return min(nap * 2, RECONNECT_MAX)


class _Flag(Protocol):
    """What the feeds need of ``threading.Event`` and ``asyncio.Event``."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...


E = TypeVar("E", bound=_Flag)


class Registry(Generic[E]):
    """The waiters' events by digest and what the subscription's messages do to them; both
    feeds are one (``guard``: a lock for threads, a null context on one event loop)."""

    def __init__(self, subscribed: E, guard: AbstractContextManager[Any]) -> None:
        self.waiters: dict[str, set[E]] = {}
        #: Set while the server has confirmed the current subscription.
        self.subscribed = subscribed
        #: A subscription was lost since the last one (the listener's).
        self.lost = False
        self._guard = guard

    def add(self, digest: str, event: E) -> None:
        with self._guard:
            self.waiters.setdefault(digest, set()).add(event)

    def remove(self, digest: str, event: E) -> None:
        with self._guard:
            waiting = self.waiters[digest]
            waiting.discard(event)
            if not waiting:
                del self.waiters[digest]

    def pending(self, digest: str) -> int:
        """How many waiters of ``digest`` are registered and not woken yet."""
        with self._guard:
            return sum(not event.is_set() for event in self.waiters.get(digest, ()))

    def dispatch(self, message: dict[str, Any]) -> bool:
        """Wake the waiters of an announced digest; True for the subscription's
        confirmation (after a lost one, announcements may have been lost meanwhile: every
        waiter wakes to look again)."""
        kind, data = message.get("type"), message.get("data")
        with self._guard:
            if kind == "subscribe":
                woken = self.waiters if self.lost else {}
                self.lost = False
                self.subscribed.set()
            elif kind == "message" and isinstance(data, bytes | str):
                digest = data.decode() if isinstance(data, bytes) else data
                woken = {digest: self.waiters.get(digest, set())}
            else:
                woken = {}
            for waiting in woken.values():
                for event in waiting:
                    event.set()
        return kind == "subscribe"

    def lost_subscription(self, channel: str, exc: BaseException, nap: float) -> None:
        """Until the listener subscribes again (in ``nap`` seconds), waiters sleep to their
        timeout; then they all look again."""
        self.subscribed.clear()
        self.lost = True
        _log.warning("change_feed_lost", channel=channel, error=type(exc).__name__,
                     retry_in=nap)  # fmt: skip

    def wake_all(self) -> None:
        """A false wake-up for every waiter (allowed: it costs each one more look)."""
        with self._guard:
            for waiting in self.waiters.values():
                for event in waiting:
                    event.set()


class ChangeFeed(Registry[threading.Event]):
    """The waiters of one :class:`RedisStore` in this process, and the one subscription
    that wakes them (module docstring)."""

    def __init__(
        self, client: Callable[[], Any], channel: str, errors: tuple[type[BaseException], ...]
    ) -> None:
        self._lock = threading.Lock()
        super().__init__(threading.Event(), self._lock)
        self._client = client  # the store's client, built on first use for a cluster URL
        self.channel = channel
        self._errors = errors
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def wait(self, digest: str, timeout: float) -> bool:
        """Block until ``digest`` is announced (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        event = threading.Event()
        self.add(digest, event)
        with self._lock:
            self._start()
        try:
            self.subscribed.wait(timeout)  # the first wait blocks once subscribed
            return event.wait(max(0.0, deadline - time.monotonic()))
        finally:
            self.remove(digest, event)

    def _start(self) -> None:
        """The listener, unless it runs (called under the lock)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.subscribed.clear()  # (a forked child inherits its parent's flag, not its thread)
        self._stop = stop = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, args=(stop,), name=f"idempotent-tasks-feed {self.channel}",
            daemon=True,
        )
        self._thread.start()

    def _listen(self, stop: threading.Event) -> None:
        nap = RECONNECT_MIN
        while not stop.is_set():
            pubsub = None
            try:
                pubsub = self._client().pubsub()
                pubsub.subscribe(self.channel)
                while not stop.is_set():
                    message = pubsub.get_message(timeout=POLL_INTERVAL)
                    if message is not None and self.dispatch(message):
                        nap = RECONNECT_MIN
            except self._errors as exc:
                self.lost_subscription(self.channel, exc, nap)
                stop.wait(nap)
                nap = next_nap(nap)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*self._errors):  # its connection is gone already
                        pubsub.close()
        self.subscribed.clear()

    def close(self) -> None:
        """Stop the listener and wait for it (it closes its subscription); the waiters
        wake now rather than at their timeout (and look at their records again)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.wake_all()


__all__ = [
    "POLL_INTERVAL",
    "RECONNECT_MAX",
    "RECONNECT_MIN",
    "ChangeFeed",
    "Registry",
    "announce_change",
    "feed_channel",
    "next_nap",
]
