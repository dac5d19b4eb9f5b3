"""RedisStore's recorded steps and UNCERTAIN status (``stores.effects``) beyond
tests/test_effects.py: the steps live in the retry counter's hash (so every script that
deletes the counter removes them), the fencing of ``save_steps``, the UNCERTAIN transitions,
and what Redis itself keeps of an UNCERTAIN record (no TTL: it waits for an operator)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks._core.records import Scope, Status
from idempotent_tasks.stores.effects import StepStore, UncertainStore
from idempotent_tasks.stores.redis import RedisStore

from .._services import REDIS_URL, require

redis = pytest.importorskip("redis")
from redis.crc import key_slot  # noqa: E402

pytestmark = pytest.mark.redis

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


@pytest.fixture
def rstore() -> Iterator[RedisStore]:
    require("redis")
    store = RedisStore(REDIS_URL, prefix=f"rfx_{uuid.uuid4().hex[:10]}", gc_ttl=1000)
    store.create_schema()
    try:
        yield store
    finally:
        store.drop_schema()
        store.close()


@pytest.fixture
def raw() -> Iterator[Any]:
    require("redis")
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def claim(store: RedisStore, now: float = NOW) -> int:
    result = store.create(S, request_hash="h", now=now, lease_expires_at=now + 30)
    assert result.created, result
    token: int = result.record.fencing_token
    return token


def uncertain(store: RedisStore, steps: bytes | None = b"s1") -> int:
    """A scope parked UNCERTAIN (with ``steps`` recorded first, when given)."""
    token = claim(store)
    if steps is not None:
        assert store.save_steps(S, token=token, steps=steps, now=NOW)
    assert store.mark_uncertain(S, token=token, now=NOW + 1, detail=b"processor: pending")
    return token


def test_both_protocols_are_implemented(rstore: RedisStore) -> None:
    assert isinstance(rstore, StepStore) and isinstance(rstore, UncertainStore)


# -- steps ---------------------------------------------------------------------------------
def test_steps_round_trip_and_are_replaced_whole(rstore: RedisStore) -> None:
    assert rstore.load_steps(S) is None
    token = claim(rstore)
    assert rstore.save_steps(S, token=token, steps=b"\x00one", now=NOW)
    assert rstore.load_steps(S) == b"\x00one"
    assert rstore.save_steps(S, token=token, steps=b"two", now=NOW)
    assert rstore.load_steps(S) == b"two"
    assert rstore.get_retry_count(S) == 0  # the counter made for the steps starts at 0


def test_steps_are_a_field_of_the_counter_in_the_scopes_slot(
    rstore: RedisStore, raw: Any
) -> None:
    token = claim(rstore)
    assert rstore.save_steps(S, token=token, steps=b"blob", now=NOW)
    k = rstore._keys(S)
    assert raw.hget(k.counter, "s") == b"blob"
    assert key_slot(k.counter.encode()) == key_slot(k.record.encode())  # Cluster-safe
    assert raw.zscore(k.counter_index, k.member) == NOW  # the purge finds the counter
    assert 0 < raw.pttl(k.counter) <= (30 + 1000) * 1000  # lease + gc_ttl, like a takeover's


@pytest.mark.parametrize("case", ["wrong token", "settled", "absent", "taken over"])
def test_save_steps_is_fenced_by_the_processing_record(rstore: RedisStore, case: str) -> None:
    token = claim(rstore) if case != "absent" else 1
    if case == "settled":
        assert rstore.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    elif case == "taken over":
        assert rstore.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
    stale = token + 1 if case == "wrong token" else token
    assert not rstore.save_steps(S, token=stale, steps=b"x", now=NOW)
    assert rstore.load_steps(S) is None


@pytest.mark.parametrize("kept_by", ["release", "record_failure", "take_over"])
def test_counting_or_releasing_an_attempt_keeps_the_steps(
    rstore: RedisStore, kept_by: str
) -> None:
    token = claim(rstore)
    assert rstore.save_steps(S, token=token, steps=b"kept", now=NOW)
    if kept_by == "release":
        assert rstore.release(S, token=token)
    elif kept_by == "record_failure":
        failed = rstore.record_failure(S, token=token, now=NOW, max_retries=5, expires_at=NOW)
        assert failed is not None and failed.retry_count == 1
    else:
        assert rstore.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
    assert rstore.load_steps(S) == b"kept"


def _reset(store: RedisStore, token: int) -> None:
    store.reset_retry_count(S)


def _reopen(store: RedisStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.reopen(S, expected_token=token, now=NOW + 1, lease_expires_at=NOW + 31)


def _replace_expired(store: RedisStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.create(S, request_hash="h", now=NOW + 61, lease_expires_at=NOW + 91).created


def _purge(store: RedisStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.delete_expired(now=NOW + 61, counters_before=NOW + 1, limit=10) == 1


@pytest.mark.parametrize("remove", [_reset, _reopen, _replace_expired, _purge],
                         ids=lambda f: f.__name__.strip("_"))
def test_whatever_removes_the_counter_removes_the_steps(rstore: RedisStore, remove: Any) -> None:
    token = claim(rstore)
    assert rstore.save_steps(S, token=token, steps=b"gone", now=NOW)
    remove(rstore, token)
    assert rstore.load_steps(S) is None


# -- UNCERTAIN -----------------------------------------------------------------------------
def test_mark_uncertain_needs_the_processing_record_and_its_token(rstore: RedisStore) -> None:
    token = claim(rstore)
    assert not rstore.mark_uncertain(S, token=token + 1, now=NOW, detail=None)
    assert rstore.mark_uncertain(S, token=token, now=NOW + 1, detail=b"why")
    assert not rstore.mark_uncertain(S, token=token, now=NOW + 2, detail=None)  # not PROCESSING
    got = rstore.get(S)
    assert got is not None
    assert (got.status, got.response, got.fencing_token) == (Status.UNCERTAIN, b"why", token)
    assert (got.lease_expires_at, got.expires_at, got.updated_at) == (None, None, NOW + 1)


def test_an_uncertain_record_and_its_steps_never_expire_in_redis(
    rstore: RedisStore, raw: Any
) -> None:
    uncertain(rstore)
    k = rstore._keys(S)
    assert (raw.pttl(k.record), raw.pttl(k.counter)) == (-1, -1)
    assert raw.zscore(k.processing, k.member) is None


def test_maintenance_lists_an_uncertain_record_and_leaves_it_alone(rstore: RedisStore) -> None:
    uncertain(rstore)
    later = NOW + 10**6
    assert rstore.find_stuck(now=later, heartbeat_before=None, limit=10) == []
    assert rstore.delete_expired(now=later, counters_before=later, limit=10) == 0
    assert [r.status for r in rstore.list_records(status=Status.UNCERTAIN)] == [Status.UNCERTAIN]
    assert rstore.stats() == {(S.operation, Status.UNCERTAIN): 1}
    assert rstore.load_steps(S) == b"s1"
    assert not rstore.reopen(S, expected_token=1, now=later, lease_expires_at=later + 30)
    created = rstore.create(S, request_hash="h", now=later, lease_expires_at=later + 30)
    assert not created.created and created.record.status is Status.UNCERTAIN


def test_resolve_done_settles_as_success_expiring_like_one(rstore: RedisStore, raw: Any) -> None:
    token = uncertain(rstore)
    assert rstore.resolve_uncertain(S, resolution="done", now=NOW + 5, response=b"ok",
                                    expires_at=NOW + 65)
    got = rstore.get(S)
    assert got is not None
    assert (got.status, got.response, got.expires_at, got.fencing_token) == (
        Status.SUCCESS, b"ok", NOW + 65, token
    )
    k = rstore._keys(S)
    assert raw.zscore(k.finished, k.member) == NOW + 65
    assert 0 < raw.pttl(k.record) <= (60 + 1000) * 1000 and raw.pttl(k.counter) > 0
    assert rstore.delete_expired(now=NOW + 66, counters_before=NOW, limit=10) == 1


def test_resolve_fail_keeps_the_detail(rstore: RedisStore) -> None:
    uncertain(rstore)
    assert rstore.resolve_uncertain(S, resolution="fail", now=NOW + 5, expires_at=NOW + 65)
    got = rstore.get(S)
    assert got is not None
    assert (got.status, got.response, got.expires_at) == (
        Status.FAILED, b"processor: pending", NOW + 65
    )


def test_resolve_retry_deletes_the_record_and_keeps_counter_and_steps(
    rstore: RedisStore, raw: Any
) -> None:
    uncertain(rstore)
    assert rstore.resolve_uncertain(S, resolution="retry", now=NOW + 5)
    assert rstore.get(S) is None and rstore.load_steps(S) == b"s1"
    k = rstore._keys(S)
    assert raw.zscore(k.finished, k.member) is None and raw.pttl(k.counter) > 0
    token = claim(rstore, NOW + 6)  # the next delivery: a new attempt that replays the steps
    assert rstore.load_steps(S) == b"s1" and token > 0


@pytest.mark.parametrize("status", ["absent", "PROCESSING", "SUCCESS"])
def test_resolve_changes_only_an_uncertain_record(rstore: RedisStore, status: str) -> None:
    if status != "absent":
        token = claim(rstore)
        if status == "SUCCESS":
            assert rstore.mark_success(S, token=token, response=b"r", now=NOW,
                                       expires_at=NOW + 60)
    before = rstore.get(S)
    for resolution in ("done", "fail", "retry"):
        assert not rstore.resolve_uncertain(S, resolution=resolution,  # type: ignore[arg-type]
                                            now=NOW + 5, expires_at=NOW + 65)
    assert rstore.get(S) == before
