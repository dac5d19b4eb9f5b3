"""DynamoDBStore's recorded steps and UNCERTAIN status (``stores.effects``) beyond
tests/test_effects.py, against moto's DynamoDB server: the steps are an attribute of the
counter item (so every write that deletes the counter removes them), ``save_steps`` is one
transaction fenced by the record, and an UNCERTAIN record (with its counter) carries no TTL
attribute and sits in an index partition of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks import DynamoDBStore, Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.effects import StepStore, UncertainStore

from .._wait import budget
from ._backends import make_dynamodb_store

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


@pytest.fixture
def store() -> Iterator[DynamoDBStore]:
    made = make_dynamodb_store()
    try:
        yield made
    finally:
        made.drop_table()
        made.close()


def claim(store: DynamoDBStore, now: float = NOW) -> int:
    result = store.create(S, request_hash="h", now=now, lease_expires_at=now + 30)
    assert result.created, result
    token: int = result.record.fencing_token
    return token


def item(store: DynamoDBStore, which: str) -> dict[str, Any] | None:
    """The raw record (``"record"``) or counter (``"counter"``) item of ``S``."""
    keys = store._keys
    key = getattr(keys, which)(keys.digest(S))
    found: dict[str, Any] | None = store.client.get_item(
        TableName=store.table_name, Key=key, ConsistentRead=True).get("Item")
    return found


def requests(store: DynamoDBStore, fn: Any) -> list[str]:
    """The DynamoDB operations ``fn`` sends."""
    names: list[str] = []

    def seen(request: Any, **_: Any) -> None:
        names.append(request.headers["X-Amz-Target"].decode().split(".")[-1])

    store.client.meta.events.register("before-send.dynamodb", seen)
    try:
        fn()
    finally:
        store.client.meta.events.unregister("before-send.dynamodb", seen)
    return names


def uncertain(store: DynamoDBStore, steps: bytes | None = b"s1") -> int:
    token = claim(store)
    if steps is not None:
        assert store.save_steps(S, token=token, steps=steps, now=NOW)
    assert store.mark_uncertain(S, token=token, now=NOW + 1, detail=b"processor: pending")
    return token


def test_both_protocols_are_implemented(store: DynamoDBStore) -> None:
    assert isinstance(store, StepStore) and isinstance(store, UncertainStore)


# -- steps ---------------------------------------------------------------------------------
def test_steps_are_one_transaction_into_the_counter_item(store: DynamoDBStore) -> None:
    assert store.load_steps(S) is None
    token = claim(store)
    sent = requests(store, lambda: store.save_steps(S, token=token, steps=b"\x00a", now=NOW))
    assert sent == ["TransactWriteItems"]
    assert store.load_steps(S) == b"\x00a" and store.get_retry_count(S) == 0
    counter = item(store, "counter")
    assert counter is not None and counter["steps"] == {"B": b"\x00a"}
    assert counter["gp"]["S"].startswith(f"{store._keys.prefix}#C#")  # the purge finds it
    assert store.save_steps(S, token=token, steps=b"b", now=NOW + 1)
    assert store.load_steps(S) == b"b"


@pytest.mark.parametrize("case", ["wrong token", "settled", "absent", "taken over"])
def test_save_steps_is_fenced_by_the_processing_record(store: DynamoDBStore, case: str) -> None:
    token = claim(store) if case != "absent" else 1
    if case == "settled":
        assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    elif case == "taken over":
        assert store.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
    stale = token + 1 if case == "wrong token" else token
    assert not store.save_steps(S, token=stale, steps=b"x", now=NOW)
    assert store.load_steps(S) is None


def test_a_takeover_racing_save_steps_leaves_one_consistent_outcome(
    store: DynamoDBStore,
) -> None:
    """The takeover and the stale owner's save start together; whichever commits first,
    the save wrote only if the record was still its own when it committed."""
    token = claim(store)
    barrier = threading.Barrier(2)
    saved: list[bool] = []

    def save() -> None:
        barrier.wait(budget(10))
        saved.append(store.save_steps(S, token=token, steps=b"stale", now=NOW + 31))

    thread = threading.Thread(target=save)
    thread.start()
    barrier.wait(budget(10))
    taken = store.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
    thread.join(budget(10))
    assert taken is not None and taken.retry_count == 1
    assert store.load_steps(S) == (b"stale" if saved[0] else None)


@pytest.mark.parametrize("kept_by", ["release", "record_failure", "take_over"])
def test_counting_or_releasing_an_attempt_keeps_the_steps(
    store: DynamoDBStore, kept_by: str
) -> None:
    token = claim(store)
    assert store.save_steps(S, token=token, steps=b"kept", now=NOW)
    if kept_by == "release":
        assert store.release(S, token=token)
    elif kept_by == "record_failure":  # the counter made by save_steps (n = 0) counts on
        failed = store.record_failure(S, token=token, now=NOW, max_retries=5, expires_at=NOW)
        assert failed is not None and failed.retry_count == 1
    else:
        taken = store.take_over(S, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.retry_count == 1
    assert store.load_steps(S) == b"kept"


def _reset(store: DynamoDBStore, token: int) -> None:
    store.reset_retry_count(S)


def _reopen(store: DynamoDBStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.reopen(S, expected_token=token, now=NOW + 1, lease_expires_at=NOW + 31)


def _replace_expired(store: DynamoDBStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.create(S, request_hash="h", now=NOW + 61, lease_expires_at=NOW + 91).created


def _purge(store: DynamoDBStore, token: int) -> None:
    assert store.mark_success(S, token=token, response=b"r", now=NOW, expires_at=NOW + 60)
    assert store.delete_expired(now=NOW + 61, counters_before=NOW + 1, limit=10) == 1


@pytest.mark.parametrize("remove", [_reset, _reopen, _replace_expired, _purge],
                         ids=lambda f: f.__name__.strip("_"))
def test_whatever_removes_the_counter_removes_the_steps(store: DynamoDBStore, remove: Any) -> None:
    token = claim(store)
    assert store.save_steps(S, token=token, steps=b"gone", now=NOW)
    remove(store, token)
    assert store.load_steps(S) is None


# -- UNCERTAIN -----------------------------------------------------------------------------
@pytest.mark.parametrize("with_counter", [True, False], ids=["counter", "no counter"])
def test_mark_uncertain_needs_the_processing_record_and_its_token(
    store: DynamoDBStore, with_counter: bool
) -> None:
    token = claim(store)
    if with_counter:
        assert store.save_steps(S, token=token, steps=b"s", now=NOW)
    assert not store.mark_uncertain(S, token=token + 1, now=NOW, detail=None)
    assert store.mark_uncertain(S, token=token, now=NOW + 1, detail=b"why")
    assert not store.mark_uncertain(S, token=token, now=NOW + 2, detail=None)
    got = store.get(S)
    assert got is not None
    assert (got.status, got.response, got.fencing_token) == (Status.UNCERTAIN, b"why", token)
    assert (got.lease_expires_at, got.expires_at, got.updated_at) == (None, None, NOW + 1)
    assert (item(store, "counter") is not None) is with_counter  # no counter made for it


def test_an_uncertain_record_and_its_steps_carry_no_ttl(store: DynamoDBStore) -> None:
    uncertain(store)
    record, counter = item(store, "record"), item(store, "counter")
    assert record is not None and counter is not None
    assert "gc" not in record and "gc" not in counter and counter["steps"] == {"B": b"s1"}
    assert record["gp"] == store._keys.status_partition(Status.UNCERTAIN, store._keys.digest(S))


def test_maintenance_lists_an_uncertain_record_and_leaves_it_alone(store: DynamoDBStore) -> None:
    uncertain(store)
    later = NOW + 10**6
    assert store.find_stuck(now=later, heartbeat_before=None, limit=10) == []
    assert store.delete_expired(now=later, counters_before=later, limit=10) == 0
    assert [r.status for r in store.list_records(status=Status.UNCERTAIN)] == [Status.UNCERTAIN]
    assert store.stats() == {(S.operation, Status.UNCERTAIN): 1}
    assert store.load_steps(S) == b"s1"  # the counter purge passed it over: it has a record
    assert store.reopen(S, expected_token=1, now=later, lease_expires_at=later + 30) is None
    created = store.create(S, request_hash="h", now=later, lease_expires_at=later + 30)
    assert not created.created and created.record.status is Status.UNCERTAIN


@pytest.mark.parametrize("resolution", ["done", "fail"])
def test_resolve_settles_it_as_a_finished_record(store: DynamoDBStore, resolution: str) -> None:
    token = uncertain(store)
    assert store.resolve_uncertain(S, resolution=resolution,  # type: ignore[arg-type]
                                   now=NOW + 5, response=b"ok", expires_at=NOW + 65)
    got = store.get(S)
    assert got is not None
    status, response = ((Status.SUCCESS, b"ok") if resolution == "done"
                        else (Status.FAILED, b"processor: pending"))
    assert (got.status, got.response, got.expires_at, got.fencing_token) == (
        status, response, NOW + 65, token
    )
    record = item(store, "record")
    assert record is not None and "gc" in record
    assert record["gp"] == store._keys.status_partition(status, store._keys.digest(S))
    assert store.delete_expired(now=NOW + 66, counters_before=NOW, limit=10) == 1


def test_resolve_retry_leaves_a_tombstone_and_keeps_counter_and_steps(
    store: DynamoDBStore,
) -> None:
    token = uncertain(store)
    assert store.resolve_uncertain(S, resolution="retry", now=NOW + 5)
    tombstone = item(store, "record")
    assert tombstone is not None and set(tombstone) == {"pk", "tk", "gc"}
    assert store.get(S) is None and store.load_steps(S) == b"s1"
    assert claim(store, NOW + 6) > token  # the next attempt: a greater token, same steps
    assert store.load_steps(S) == b"s1"


@pytest.mark.parametrize("status", ["absent", "PROCESSING", "SUCCESS"])
def test_resolve_changes_only_an_uncertain_record(store: DynamoDBStore, status: str) -> None:
    if status != "absent":
        token = claim(store)
        if status == "SUCCESS":
            assert store.mark_success(S, token=token, response=b"r", now=NOW,
                                      expires_at=NOW + 60)
    before = store.get(S)
    for resolution in ("done", "fail", "retry"):
        assert not store.resolve_uncertain(S, resolution=resolution,  # type: ignore[arg-type]
                                           now=NOW + 5, expires_at=NOW + 65)
    assert store.get(S) == before
