"""The optional change feed (``stores.changes``): an announcement wakes a scope's waiters;
without one a wait ends at its timeout.  Skipped on a store that does not implement it
(waiting duplicates then poll with backoff)."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from .._core.records import Scope
from ..stores.base import Store
from ..stores.changes import ChangeFeedStore
from ._common import PATIENCE, RACERS, S

#: How often the announcing side repeats itself while the waiters may not be listening yet
#: (an announcement made before a wait started need not wake it).
_AGAIN = 0.01


def feed_of(store: Store) -> ChangeFeedStore:
    """``store``, when it implements the change feed; else the rule is skipped."""
    if not callable(getattr(store, "wait_for_change", None)):
        pytest.skip(f"{store.name} store has no change feed (waiters poll)")
    return cast(ChangeFeedStore, store)


def announced_until_woken(feed: ChangeFeedStore, waiters: int) -> list[bool]:
    """``waiters`` threads wait for ``S`` (PATIENCE at most) while ``S`` is announced again
    and again until every wait has returned; what each returned."""
    got: list[bool] = []
    lock = threading.Lock()
    finished = threading.Semaphore(0)

    def wait() -> None:
        woken = feed.wait_for_change(S, timeout=PATIENCE)
        with lock:
            got.append(woken)
        finished.release()

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(waiters)]
    for thread in threads:
        thread.start()
    for _ in range(waiters):
        while not finished.acquire(timeout=_AGAIN):
            feed.announce_change(S)
    for thread in threads:
        thread.join(PATIENCE)
    return got


class ChangeFeedRules:
    """``announce_change`` wakes the waiters of its scope; ``wait_for_change`` returns
    False at its timeout when nothing was announced."""

    def test_a_wait_with_nothing_announced_ends_at_its_timeout(self, store: Store) -> None:
        feed = feed_of(store)
        assert feed.wait_for_change(S, timeout=0.05) is False

    def test_an_announcement_wakes_every_waiter_of_the_scope(self, store: Store) -> None:
        assert announced_until_woken(feed_of(store), RACERS) == [True] * RACERS

    def test_announcing_a_scope_nobody_waits_for_is_harmless(self, store: Store) -> None:
        feed = feed_of(store)
        feed.announce_change(Scope("acme", "payments.charge", "nobody-waits"))
        assert feed.wait_for_change(S, timeout=0.05) is False
