"""The optional ``reopen`` primitive (``stores.reopen``): a settled record given to a new
attempt, atomically and only for the attempt the caller read.  Skipped on a store that does
not implement it (the reuse policies then refuse to run on it)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from .._core.records import Status, StoredRecord
from ..stores.base import Store
from ..stores.effects import UncertainStore
from ..stores.reopen import ReopenStore
from ._common import NOW, RACERS, S, race, token_of

#: When the rules reopen, and the new attempt's lease.
LATER = NOW + 100
LEASE_AFTER = LATER + 30


def reopener(store: Store) -> ReopenStore:
    """``store``, when it implements ``reopen``; else the rule is skipped."""
    if not callable(getattr(store, "reopen", None)):
        pytest.skip(f"{store.name} store does not implement the optional reopen primitive")
    return cast(ReopenStore, store)


def settled(store: Store, status: Status, *, counted: bool = True) -> int:
    """A SUCCESS or FAILED record of ``S`` with a retry count of 1 (when ``counted``); its
    attempt's token."""
    token = token_of(store)
    if counted:  # the first attempt crashed: a takeover counts it
        taken = store.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.retry_count == 1
        token = taken.token
    if status is Status.SUCCESS:
        assert store.mark_success(S, token=token, response=b"done", now=NOW + 40,
                                  expires_at=NOW + 1000)
    else:
        assert store.mark_failed(S, token=token, now=NOW + 40, expires_at=NOW + 1000,
                                 response=b"why")
    return token


def reopen(store: Store, token: int, now: float = LATER) -> int | None:
    return reopener(store).reopen(S, expected_token=token, now=now,
                                  lease_expires_at=now + 30)


def assert_reopened(got: StoredRecord | None, token: int, now: float = LATER) -> None:
    """``got`` is the new attempt ``token``, claimed at ``now`` (the request hash kept)."""
    assert got is not None and got.status is Status.PROCESSING, got
    assert got.fencing_token == token and got.request_hash == "h1"
    assert got.created_at == now and got.updated_at == now
    assert got.lease_expires_at == now + 30
    assert got.response is None and got.expires_at is None


def reopens_settled(store: Store, status: Status) -> None:
    """A ``status`` record (its counter at 1) reopened: a new, greater token, the record a
    fresh PROCESSING claim, the counter reset."""
    reopener(store)
    old = settled(store, status)
    assert store.get_retry_count(S) == 1
    new = reopen(store, old)
    assert new is not None and new > old
    assert_reopened(store.get(S), new)
    assert store.get_retry_count(S) == 0  # a new execution counts afresh


class ReopenRules:
    """``reopen``: SUCCESS/FAILED of the expected token → PROCESSING, a new token, the
    counter reset; anything else changes nothing."""

    def test_reopen_gives_a_success_record_to_a_new_attempt(self, store: Store) -> None:
        reopens_settled(store, Status.SUCCESS)

    def test_reopen_gives_a_failed_record_to_a_new_attempt(self, store: Store) -> None:
        reopens_settled(store, Status.FAILED)

    def test_reopen_of_a_poisoned_record_resets_its_counter(self, store: Store) -> None:
        reopener(store)
        token = token_of(store)
        failed = store.record_failure(S, token=token, now=NOW + 1, max_retries=1,
                                      expires_at=NOW + 1000)
        assert failed is not None and failed.poisoned
        new = reopen(store, token)
        assert new is not None and new > token
        assert_reopened(store.get(S), new)
        assert store.get_retry_count(S) == 0

    def test_reopen_refuses_another_attempts_token(self, store: Store) -> None:
        reopener(store)
        old = settled(store, Status.SUCCESS)
        before = store.get(S)
        for wrong in (old - 1, old + 1, old + 1000):
            assert reopen(store, wrong) is None
        assert store.get(S) == before
        assert store.get_retry_count(S) == 1

    def test_reopen_refuses_a_processing_record_and_a_missing_one(self, store: Store) -> None:
        reopener(store)
        assert reopen(store, 1) is None
        assert store.get(S) is None and store.get_retry_count(S) == 0
        token = token_of(store)
        before = store.get(S)
        assert reopen(store, token) is None  # the attempt runs: nothing to reopen
        assert reopen(store, token, now=NOW + 1000) is None  # not even once its lease expired
        assert store.get(S) == before

    def test_reopen_refuses_an_uncertain_record(self, store: Store) -> None:
        """UNCERTAIN (``stores.effects``) is settled by an operator, never by a new attempt."""
        reopener(store)
        if not callable(getattr(store, "mark_uncertain", None)):
            pytest.skip(f"{store.name} store does not keep UNCERTAIN records")
        token = token_of(store)
        assert cast(UncertainStore, store).mark_uncertain(S, token=token, now=NOW + 1,
                                                          detail=b"unknown")
        before = store.get(S)
        assert reopen(store, token) is None
        assert store.get(S) == before

    def test_concurrent_reopens_of_one_attempt_exactly_one_wins(self, store: Store) -> None:
        reopener(store)
        old = settled(store, Status.FAILED)
        results = race(lambda _: reopen(store, old))
        winners = [r for r in results if r is not None]
        assert len(results) == RACERS and len(winners) == 1, results
        assert winners[0] > old
        assert_reopened(store.get(S), winners[0])
        assert store.get_retry_count(S) == 0

    def test_after_reopen_only_the_new_attempt_may_write(self, store: Store) -> None:
        reopener(store)
        old = settled(store, Status.SUCCESS)
        new = reopen(store, old)
        assert new is not None
        assert reopen(store, old) is None  # the old attempt cannot reopen twice
        stale: list[Any] = [
            store.heartbeat(S, token=old, now=LATER + 1, lease_expires_at=LATER + 60),
            store.mark_success(S, token=old, response=b"stale", now=LATER + 1,
                               expires_at=LATER + 99),
            store.mark_failed(S, token=old, now=LATER + 1, expires_at=LATER + 99),
            store.record_failure(S, token=old, now=LATER + 1, max_retries=3,
                                 expires_at=LATER + 99),
            store.release(S, token=old),
        ]
        assert stale == [False, False, False, None, False]
        assert_reopened(store.get(S), new)
        assert store.mark_success(S, token=new, response=b"again", now=LATER + 2,
                                  expires_at=LATER + 500)
        got = store.get(S)
        assert got is not None and got.status is Status.SUCCESS and got.response == b"again"
        assert got.fencing_token == new and got.expires_at == LATER + 500

    def test_a_reopened_attempt_can_be_taken_over_once_its_lease_expires(
        self, store: Store
    ) -> None:
        reopener(store)
        old = settled(store, Status.FAILED, counted=False)
        new = reopen(store, old)
        assert new is not None and new > old
        assert store.take_over(S, expected_token=new, now=LATER + 1,
                               lease_expires_at=LATER + 60) is None  # its lease still runs
        taken = store.take_over(S, expected_token=new, now=LEASE_AFTER,
                                lease_expires_at=LEASE_AFTER + 30)
        assert taken is not None and taken.token > new and taken.retry_count == 1
        assert store.mark_success(S, token=taken.token, response=b"ok", now=LEASE_AFTER + 1,
                                  expires_at=LEASE_AFTER + 99)
        again = reopen(store, taken.token, now=LEASE_AFTER + 2)
        assert again is not None and again > taken.token  # tokens keep growing
        assert_reopened(store.get(S), again, now=LEASE_AFTER + 2)
        assert store.get_retry_count(S) == 0
