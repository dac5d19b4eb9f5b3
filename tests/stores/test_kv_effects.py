"""Recorded steps and the UNCERTAIN status (``stores.effects``) on the Redis and DynamoDB
stores, primitive by primitive (tests/test_effects.py runs them through the handler): the
round trip, the fencing of ``save_steps``, steps following the retry counter, and the
UNCERTAIN transitions.  What each backend keeps of them (keys, TTLs, index entries,
requests) is tested in test_redis_effects.py and test_dynamodb_effects.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.effects import StepStore, UncertainStore

from ..conftest import drop_store, make_store

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


@pytest.fixture(params=["redis", "dynamodb"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = make_store(request.param, tmp_path)
    try:
        yield made
    finally:
        drop_store(made)


def claim(store: Any, now: float = NOW) -> int:
    result = store.create(S, request_hash="h", now=now, lease_expires_at=now + 30)
    assert result.created, result
    token: int = result.record.fencing_token
    return token


def uncertain(store: Any, steps: bytes | None = b"s1") -> int:
    """``S`` parked UNCERTAIN with the detail ``processor: pending`` (``steps`` recorded
    first, when given); its attempt's token."""
    token = claim(store)
    if steps is not None:
        assert store.save_steps(S, token=token, steps=steps, now=NOW)
    assert store.mark_uncertain(S, token=token, now=NOW + 1, detail=b"processor: pending")
    return token


def test_both_protocols_are_implemented(kv: Any) -> None:
    assert isinstance(kv, StepStore) and isinstance(kv, UncertainStore)


# -- steps ---------------------------------------------------------------------------------
def test_steps_round_trip_and_are_replaced_whole(kv: Any) -> None:
    assert kv.load_steps(S) is None
    token = claim(kv)
    assert kv.save_steps(S, token=token, steps=b"\x00one", now=NOW)
    assert kv.load_steps(S) == b"\x00one"
    assert kv.save_steps(S, token=token, steps=b"two", now=NOW + 1)
    assert kv.load_steps(S) == b"two"
    assert kv.get_retry_count(S) == 0  # the counter made for the steps starts at 0


@pytest.mark.parametrize("case", ["wrong token", "settled", "absent", "taken over"])
def test_save_steps_is_fenced_by_the_processing_record(kv: Any, case: str) -> None:
    token = claim(kv) if case != "absent" else 1
    if case == "settled":
        assert kv.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    elif case == "taken over":
        assert kv.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
    stale = token + 1 if case == "wrong token" else token
    assert not kv.save_steps(S, token=stale, steps=b"x", now=NOW)
    assert kv.load_steps(S) is None


@pytest.mark.parametrize("kept_by", ["release", "record_failure", "take_over"])
def test_counting_or_releasing_an_attempt_keeps_the_steps(kv: Any, kept_by: str) -> None:
    token = claim(kv)
    assert kv.save_steps(S, token=token, steps=b"kept", now=NOW)
    if kept_by == "release":
        assert kv.release(S, token=token)
    elif kept_by == "record_failure":  # the counter made by save_steps (at 0) counts on
        failed = kv.record_failure(S, token=token, now=NOW, max_retries=5, expires_at=NOW)
        assert failed is not None and failed.retry_count == 1
    else:
        taken = kv.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.retry_count == 1
    assert kv.load_steps(S) == b"kept"


def _reset(store: Any, token: int) -> None:
    store.reset_retry_count(S)


def _reopen(store: Any, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.reopen(S, expected_token=token, now=NOW + 1, lease_expires_at=NOW + 31)


def _replace_expired(store: Any, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.create(S, request_hash="h", now=NOW + 61, lease_expires_at=NOW + 91).created


def _purge(store: Any, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.delete_expired(now=NOW + 61, counters_before=NOW + 1, limit=10) == 1


@pytest.mark.parametrize("remove", [_reset, _reopen, _replace_expired, _purge],
                         ids=lambda f: f.__name__.strip("_"))
def test_whatever_removes_the_counter_removes_the_steps(kv: Any, remove: Any) -> None:
    token = claim(kv)
    assert kv.save_steps(S, token=token, steps=b"gone", now=NOW)
    remove(kv, token)
    assert kv.load_steps(S) is None


# -- UNCERTAIN -----------------------------------------------------------------------------
def test_mark_uncertain_needs_the_processing_record_and_its_token(kv: Any) -> None:
    token = claim(kv)
    assert not kv.mark_uncertain(S, token=token + 1, now=NOW, detail=None)
    assert kv.mark_uncertain(S, token=token, now=NOW + 1, detail=b"why")
    assert not kv.mark_uncertain(S, token=token, now=NOW + 2, detail=None)  # not PROCESSING
    got = kv.get(S)
    assert got is not None
    assert (got.status, got.response, got.fencing_token) == (Status.UNCERTAIN, b"why", token)
    assert (got.lease_expires_at, got.expires_at, got.updated_at) == (None, None, NOW + 1)


def test_maintenance_lists_an_uncertain_record_and_leaves_it_alone(kv: Any) -> None:
    uncertain(kv)
    later = NOW + 10**6
    assert kv.find_stuck(now=later, heartbeat_before=None, limit=10) == []
    assert kv.delete_expired(now=later, counters_before=later, limit=10) == 0
    assert [r.status for r in kv.list_records(status=Status.UNCERTAIN)] == [Status.UNCERTAIN]
    assert kv.stats() == {(S.operation, Status.UNCERTAIN): 1}
    assert kv.load_steps(S) == b"s1"  # the counter purge passed it over: it has a record
    assert kv.reopen(S, expected_token=1, now=later, lease_expires_at=later + 30) is None
    created = kv.create(S, request_hash="h", now=later, lease_expires_at=later + 30)
    assert not created.created and created.record.status is Status.UNCERTAIN


@pytest.mark.parametrize("resolution", ["done", "fail"])
def test_resolve_settles_it_as_a_finished_record(kv: Any, resolution: str) -> None:
    token = uncertain(kv)
    assert kv.resolve_uncertain(S, resolution=resolution, now=NOW + 5, response=b"ok",
                                expires_at=NOW + 65)
    got = kv.get(S)
    assert got is not None
    status, response = ((Status.SUCCESS, b"ok") if resolution == "done"
                        else (Status.FAILED, b"processor: pending"))  # fail keeps the detail
    assert (got.status, got.response, got.expires_at, got.fencing_token) == (
        status, response, NOW + 65, token
    )
    assert kv.delete_expired(now=NOW + 66, counters_before=NOW, limit=10) == 1


def test_resolve_retry_deletes_the_record_and_keeps_counter_and_steps(kv: Any) -> None:
    token = uncertain(kv)
    assert kv.resolve_uncertain(S, resolution="retry", now=NOW + 5)
    assert kv.get(S) is None and kv.load_steps(S) == b"s1"
    assert claim(kv, NOW + 6) > token  # the next delivery: a new attempt, same steps
    assert kv.load_steps(S) == b"s1"


@pytest.mark.parametrize("status", ["absent", "PROCESSING", "SUCCESS"])
def test_resolve_changes_only_an_uncertain_record(kv: Any, status: str) -> None:
    if status != "absent":
        token = claim(kv)
        if status == "SUCCESS":
            assert kv.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    before = kv.get(S)
    for resolution in ("done", "fail", "retry"):
        assert not kv.resolve_uncertain(S, resolution=resolution, now=NOW + 5,
                                        expires_at=NOW + 65)
    assert kv.get(S) == before
