"""RedisStore's change feed (``stores.changes``) on the real Redis: one ``PUBLISH`` wakes the
waiters of a scope, in this process or another, through one subscription per store.

Every store here runs on a prefix and a client name of its own, so the subscriber connection
and channel the tests count are theirs alone.  No test waits for an announcement by
sleeping: each waits until the feed shows its waiters registered (and the server their
subscription), then announces.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks import StoreUnavailableError
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores._feed import scope_digest
from idempotent_tasks.stores.changes import ChangeFeedStore
from idempotent_tasks.stores.redis import RedisStore
from idempotent_tasks.stores.redis._pubsub import feed_channel

from .._services import REDIS_URL, require
from .._wait import budget, wait_until

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis

A = Scope("acme", "payments.charge", "order-1")
B = Scope("acme", "payments.charge", "order-2")
#: ``python -c`` code: a sync store announces ``Scope(*argv[3:6])`` on Redis ``argv[1]``
#: with prefix ``argv[2]``.
ANNOUNCE_IN_A_CHILD = (
    "import sys\n"
    "from idempotent_tasks.stores.redis import RedisStore\n"
    "from idempotent_tasks._core.records import Scope\n"
    "store = RedisStore(sys.argv[1], prefix=sys.argv[2])\n"
    "store.announce_change(Scope(*sys.argv[3:6]))\n"
    "store.close()\n"
)


def subscriber_ids(clients: list[dict[str, Any]], name: str) -> list[int]:
    """Server ids of the subscribed connections named ``name`` (``CLIENT LIST``)."""
    return [int(c["id"]) for c in clients if c.get("name") == name and "P" in c.get("flags", "")]


class Feed:
    """A store on a client named after the test, and a plain client to look at Redis with."""

    def __init__(self) -> None:
        self.name = f"feed-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(REDIS_URL, client_name=self.name)
        self.store = RedisStore(self.client, prefix=f"rf_{uuid.uuid4().hex[:10]}")
        self.raw = redis.Redis.from_url(REDIS_URL)
        self.channel = feed_channel(self.store.prefix)

    def subscribers(self) -> list[int]:
        return subscriber_ids(self.raw.client_list(), self.name)

    def numsub(self) -> int:
        return int(self.raw.pubsub_numsub(self.channel)[0][1])

    def ready(self, *scopes: Scope) -> bool:
        """Every waiter of ``scopes`` registered and the subscription confirmed."""
        feed = self.store._feed
        return feed.subscribed.is_set() and all(feed.pending(scope_digest(s)) for s in scopes)

    def close(self) -> None:
        self.store.close()
        self.client.close()
        self.raw.close()


class Waiter(threading.Thread):
    def __init__(self, store: RedisStore, scope: Scope, timeout: float) -> None:
        super().__init__(daemon=True)
        self.store, self.scope, self.timeout = store, scope, timeout
        self.woken: bool | None = None

    def run(self) -> None:
        self.woken = self.store.wait_for_change(self.scope, timeout=self.timeout)

    def result(self) -> bool | None:
        self.join(budget(10))
        assert not self.is_alive(), "the waiter is still blocked"
        return self.woken


@pytest.fixture
def feed() -> Iterator[Feed]:
    require("redis")
    f = Feed()
    try:
        yield f
    finally:
        f.close()


def started(f: Feed, *scopes: Scope, timeout: float = 60.0) -> list[Waiter]:
    waiters = [Waiter(f.store, s, budget(timeout)) for s in scopes]
    for w in waiters:
        w.start()
    wait_until(lambda: f.ready(*scopes), "the waiters registered and subscribed", 10)
    return waiters


def test_the_redis_stores_are_change_feed_stores(feed: Feed) -> None:
    assert isinstance(feed.store, ChangeFeedStore)


def test_an_announcement_wakes_a_waiter_in_another_thread(feed: Feed) -> None:
    [waiter] = started(feed, A)
    feed.store.announce_change(A)
    assert waiter.result() is True


def test_an_announcement_from_another_process_wakes_a_waiter(feed: Feed) -> None:
    [waiter] = started(feed, A)
    subprocess.run(
        [sys.executable, "-c", ANNOUNCE_IN_A_CHILD, REDIS_URL, feed.store.prefix, *A],
        check=True, timeout=budget(60),
    )  # fmt: skip
    assert waiter.result() is True


def test_a_wait_nobody_announces_returns_false_at_its_timeout(feed: Feed) -> None:
    start = time.monotonic()
    assert feed.store.wait_for_change(A, timeout=0.05) is False
    assert time.monotonic() - start >= 0.05
    assert feed.store._feed.pending(scope_digest(A)) == 0  # the waiter left the registry


def test_another_scopes_announcement_does_not_wake_a_waiter(feed: Feed) -> None:
    waiter_a, waiter_b = started(feed, A, B)
    feed.store.announce_change(B)
    assert waiter_b.result() is True
    # B's waiter leaves the registry only after the whole message was dispatched, so A's
    # waiter would be woken by now if B's announcement could wake it.
    assert feed.store._feed.pending(scope_digest(A)) == 1
    feed.store.announce_change(A)
    assert waiter_a.result() is True


def test_many_waiters_share_one_subscriber_connection(feed: Feed) -> None:
    scopes = [Scope("acme", "op", f"k{i % 5}") for i in range(20)]
    waiters = started(feed, *scopes)
    assert len(feed.subscribers()) == 1
    assert feed.numsub() == 1
    for scope in scopes[:5]:
        feed.store.announce_change(scope)
    assert [w.result() for w in waiters] == [True] * 20


def test_the_subscription_comes_back_after_the_server_kills_it(feed: Feed) -> None:
    [first] = started(feed, A)
    [killed] = feed.subscribers()
    feed.raw.client_kill_filter(_id=killed)
    # what was announced during the drop is lost: subscribed again, the feed wakes every
    # waiter to look at its record again (nobody announced A)
    assert first.result() is True
    assert feed.subscribers() not in ([], [killed]) and feed.numsub() == 1
    [second] = started(feed, B)
    feed.store.announce_change(B)
    assert second.result() is True


def test_close_stops_the_listener_and_a_later_wait_subscribes_again(feed: Feed) -> None:
    [waiter] = started(feed, A)
    thread = feed.store._feed._thread
    assert thread is not None
    feed.store.close()
    assert not thread.is_alive()
    wait_until(lambda: feed.numsub() == 0, "the subscription closed", 10)
    assert waiter.result() is True  # woken by close (it looks at its record again)
    [again] = started(feed, B)
    feed.store.announce_change(B)
    assert again.result() is True


def test_a_server_that_is_down_fails_announce_and_lets_waits_time_out() -> None:
    store = RedisStore("redis://127.0.0.1:1/0", connect_timeout=0.5)
    try:
        with pytest.raises(StoreUnavailableError):
            store.announce_change(A)
        assert store.wait_for_change(A, timeout=0.2) is False
    finally:
        store.close()


def test_announcements_carry_a_digest_never_the_scope(feed: Feed) -> None:
    pubsub: Any = feed.raw.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(feed.channel)
    wait_until(lambda: feed.numsub() == 1, "the test's subscription", 10)
    feed.store.announce_change(A)
    message = None
    deadline = time.monotonic() + budget(10)
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
    pubsub.close()
    assert message is not None and message["data"] == scope_digest(A).encode()
    assert all(part.encode() not in message["data"] for part in A)
