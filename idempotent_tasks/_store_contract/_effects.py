"""The optional primitives behind effects outside the database (``stores.effects``): recorded
steps, which live and die with the retry counter, and the UNCERTAIN status an operator
resolves.  Skipped on a store that does not implement them (the handler then refuses
``ctx.step`` and ``on_stuck="reconcile"``)."""

from __future__ import annotations

from typing import cast

import pytest

from .._core.records import Status
from ..stores.base import Store
from ..stores.effects import StepStore, UncertainStore
from ._common import LEASE, NOW, S, claim, expire, token_of

#: Long after every lease and expiry the rules set.
LATER = NOW + 10_000


def stepper(store: Store) -> StepStore:
    """``store``, when it keeps recorded steps; else the rule is skipped."""
    if not callable(getattr(store, "save_steps", None)):
        pytest.skip(f"{store.name} store does not keep recorded steps")
    return cast(StepStore, store)


def uncertain(store: Store) -> UncertainStore:
    """``store``, when it keeps UNCERTAIN records; else the rule is skipped."""
    if not callable(getattr(store, "mark_uncertain", None)):
        pytest.skip(f"{store.name} store does not keep UNCERTAIN records")
    return cast(UncertainStore, store)


def saved(store: Store, steps: bytes = b"steps-1") -> int:
    """A claim of ``S`` with ``steps`` saved; its token."""
    token = token_of(store)
    assert stepper(store).save_steps(S, token=token, steps=steps, now=NOW + 1)
    return token


def parked(store: Store) -> int:
    """An UNCERTAIN record of ``S`` (steps saved, detail ``b"unknown"``); its token."""
    token = saved(store)
    assert uncertain(store).mark_uncertain(S, token=token, now=NOW + 2, detail=b"unknown")
    return token


class StepRules:
    """``save_steps`` / ``load_steps``: fenced writes of one blob kept with the counter."""

    def test_saved_steps_load_back_and_a_save_replaces_them(self, store: Store) -> None:
        steps = stepper(store)
        assert steps.load_steps(S) is None
        token = saved(store)
        assert steps.load_steps(S) == b"steps-1"
        assert store.get_retry_count(S) == 0  # the counter created at 0
        assert steps.save_steps(S, token=token, steps=b"steps-2", now=NOW + 2)
        assert steps.load_steps(S) == b"steps-2"
        assert steps.save_steps(S, token=token, steps=b"steps-2", now=NOW + 3)  # same value

    def test_save_steps_is_refused_without_the_running_attempt(self, store: Store) -> None:
        steps = stepper(store)
        assert not steps.save_steps(S, token=1, steps=b"x", now=NOW)  # no record
        token = token_of(store)
        for wrong in (token - 1, token + 1):
            assert not steps.save_steps(S, token=wrong, steps=b"x", now=NOW + 1)
        assert steps.load_steps(S) is None and store.get_retry_count(S) == 0
        assert store.mark_success(S, token=token, response=b"r", now=NOW + 2,
                                  expires_at=NOW + 1000)
        assert not steps.save_steps(S, token=token, steps=b"x", now=NOW + 3)  # settled
        assert steps.load_steps(S) is None

    def test_steps_survive_a_release_and_counted_attempts(self, store: Store) -> None:
        steps = stepper(store)
        token = saved(store)
        assert store.release(S, token=token)
        assert steps.load_steps(S) == b"steps-1"
        token = saved(store, b"steps-2")
        failed = store.record_failure(S, token=token, now=NOW + 2, max_retries=5,
                                      expires_at=NOW + 1000)
        assert failed is not None and failed.retry_count == 1
        assert steps.load_steps(S) == b"steps-2"
        token = saved(store, b"steps-3")
        taken = store.take_over(S, expected_token=token, now=LEASE + 1,
                                lease_expires_at=LEASE + 31)
        assert taken is not None and taken.retry_count == 2
        assert steps.load_steps(S) == b"steps-3"
        assert not steps.save_steps(S, token=token, steps=b"stale", now=LEASE + 2)
        assert steps.save_steps(S, token=taken.token, steps=b"steps-4", now=LEASE + 2)
        assert steps.load_steps(S) == b"steps-4"

    def test_resetting_the_counter_removes_the_steps(self, store: Store) -> None:
        steps = stepper(store)
        token = saved(store)
        store.reset_retry_count(S)
        assert steps.load_steps(S) is None
        assert steps.save_steps(S, token=token, steps=b"again", now=NOW + 2)
        assert steps.load_steps(S) == b"again"

    def test_a_claim_over_an_expired_record_starts_without_steps(self, store: Store) -> None:
        steps = stepper(store)
        token = saved(store)
        expire(store, S, token, NOW + 100)
        assert claim(store, now=NOW + 200).created
        assert steps.load_steps(S) is None

    def test_reopen_removes_the_steps(self, store: Store) -> None:
        steps = stepper(store)
        if not callable(getattr(store, "reopen", None)):
            pytest.skip(f"{store.name} store does not implement reopen")
        token = saved(store)
        assert store.mark_success(S, token=token, response=b"r", now=NOW + 2,
                                  expires_at=NOW + 1000)
        assert store.reopen(S, expected_token=token, now=NOW + 3,  # type: ignore[attr-defined]
                            lease_expires_at=NOW + 33) is not None
        assert steps.load_steps(S) is None

    def test_the_counter_cleanup_removes_the_steps(self, store: Store) -> None:
        steps = stepper(store)
        assert store.release(S, token=saved(store))
        store.delete_expired(now=LATER, counters_before=LATER, limit=100)
        assert steps.load_steps(S) is None and store.get_retry_count(S) == 0


class UncertainRules:
    """``mark_uncertain`` (PROCESSING + token only) and ``resolve_uncertain`` (UNCERTAIN
    only); an UNCERTAIN record waits for an operator, never for recovery or expiry."""

    def test_mark_uncertain_needs_the_running_attempt(self, store: Store) -> None:
        u = uncertain(store)
        assert not u.mark_uncertain(S, token=1, now=NOW, detail=b"d")  # no record
        token = token_of(store)
        before = store.get(S)
        for wrong in (token - 1, token + 1):
            assert not u.mark_uncertain(S, token=wrong, now=NOW + 1, detail=b"d")
        assert store.get(S) == before
        assert u.mark_uncertain(S, token=token, now=NOW + 2, detail=b"unknown")
        got = store.get(S)
        assert got is not None and got.status is Status.UNCERTAIN, got
        assert (got.response, got.fencing_token, got.updated_at) == (b"unknown", token, NOW + 2)
        assert got.lease_expires_at is None and got.expires_at is None
        assert not u.mark_uncertain(S, token=token, now=NOW + 3, detail=b"again")
        assert not store.mark_success(S, token=token, response=b"r", now=NOW + 3,
                                      expires_at=NOW + 99)
        assert not store.release(S, token=token)
        assert store.get(S) == got

    def test_resolve_done_records_the_result(self, store: Store) -> None:
        u = uncertain(store)
        token = parked(store)
        assert u.resolve_uncertain(S, resolution="done", now=NOW + 5, response=b"result",
                                   expires_at=NOW + 500)
        got = store.get(S)
        assert got is not None and got.status is Status.SUCCESS, got
        assert (got.response, got.expires_at, got.fencing_token) == (
            b"result", NOW + 500, token)
        assert not u.resolve_uncertain(S, resolution="done", now=NOW + 6, response=b"x",
                                       expires_at=NOW + 600)
        assert store.get(S) == got

    def test_resolve_fail_keeps_the_detail(self, store: Store) -> None:
        u = uncertain(store)
        token = parked(store)
        assert u.resolve_uncertain(S, resolution="fail", now=NOW + 5, expires_at=NOW + 500)
        got = store.get(S)
        assert got is not None and got.status is Status.FAILED, got
        assert (got.response, got.expires_at, got.fencing_token) == (
            b"unknown", NOW + 500, token)

    def test_resolve_retry_deletes_the_record_and_keeps_the_steps(self, store: Store) -> None:
        u = uncertain(store)
        parked(store)
        assert u.resolve_uncertain(S, resolution="retry", now=NOW + 5)
        assert store.get(S) is None
        assert stepper(store).load_steps(S) == b"steps-1"
        assert not u.resolve_uncertain(S, resolution="retry", now=NOW + 6)

    def test_resolve_changes_nothing_but_an_uncertain_record(self, store: Store) -> None:
        u = uncertain(store)
        assert not u.resolve_uncertain(S, resolution="retry", now=NOW)  # no record
        token = token_of(store)
        before = store.get(S)
        for resolution in ("done", "fail", "retry"):
            assert not u.resolve_uncertain(S, resolution=resolution,
                                           now=NOW + 1, response=b"x", expires_at=NOW + 99)
        assert store.get(S) == before
        assert store.mark_success(S, token=token, response=b"r", now=NOW + 2,
                                  expires_at=NOW + 1000)
        settled = store.get(S)
        assert not u.resolve_uncertain(S, resolution="retry", now=NOW + 3)
        assert store.get(S) == settled

    def test_an_uncertain_record_is_neither_stuck_nor_expired(self, store: Store) -> None:
        uncertain(store)
        parked(store)
        assert store.find_stuck(now=LATER, heartbeat_before=None, limit=10) == []
        assert store.find_stuck(now=LATER, heartbeat_before=LATER, limit=10) == []
        store.delete_expired(now=LATER, counters_before=LATER, limit=100)
        got = store.get(S)
        assert got is not None and got.status is Status.UNCERTAIN

    def test_operators_see_uncertain_records(self, store: Store) -> None:
        uncertain(store)
        parked(store)
        assert store.stats().get((S.operation, Status.UNCERTAIN)) == 1
        listed = store.list_records(status=Status.UNCERTAIN)
        assert [r.scope for r in listed] == [S] and listed[0].status is Status.UNCERTAIN
        assert store.list_records(status=Status.PROCESSING) == []
