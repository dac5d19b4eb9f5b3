"""What DynamoDB keeps of the recorded steps and UNCERTAIN records (the rules themselves:
test_kv_effects.py), against moto's DynamoDB server: the steps are an attribute of the
counter item written by one transaction fenced by the record, and an UNCERTAIN record (with
its counter) carries no TTL attribute and sits in an index partition of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import DynamoDBStore, Status

from .._wait import budget
from ..conftest import drop_store, make_store
from .test_kv_effects import NOW, S, claim, uncertain


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DynamoDBStore]:
    made = make_store("dynamodb", tmp_path)
    assert isinstance(made, DynamoDBStore)
    try:
        yield made
    finally:
        drop_store(made)


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


def test_steps_are_one_transaction_into_the_counter_item(store: DynamoDBStore) -> None:
    token = claim(store)
    sent = requests(store, lambda: store.save_steps(S, token=token, steps=b"\x00a", now=NOW))
    assert sent == ["TransactWriteItems"]
    counter = item(store, "counter")
    assert counter is not None and counter["steps"] == {"B": b"\x00a"}
    assert counter["n"] == {"N": "0"}
    assert counter["gp"]["S"].startswith(f"{store._keys.prefix}#C#")  # the purge finds it


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


@pytest.mark.parametrize("with_counter", [True, False], ids=["counter", "no counter"])
def test_mark_uncertain_removes_the_ttl_attributes(
    store: DynamoDBStore, with_counter: bool
) -> None:
    uncertain(store, steps=b"s1" if with_counter else None)
    record, counter = item(store, "record"), item(store, "counter")
    assert record is not None and "gc" not in record and "le" not in record
    assert record["gp"] == store._keys.status_partition(Status.UNCERTAIN, store._keys.digest(S))
    if with_counter:
        assert counter is not None and "gc" not in counter and counter["steps"] == {"B": b"s1"}
    else:
        assert counter is None  # none made for it


@pytest.mark.parametrize("resolution", ["done", "fail"])
def test_a_resolution_indexes_and_collects_it_as_a_finished_record(
    store: DynamoDBStore, resolution: str
) -> None:
    uncertain(store)
    assert store.resolve_uncertain(S, resolution=resolution,  # type: ignore[arg-type]
                                   now=NOW + 5, response=b"ok", expires_at=NOW + 65)
    status = Status.SUCCESS if resolution == "done" else Status.FAILED
    record = item(store, "record")
    assert record is not None and "gc" in record and record["ex"] == {"N": repr(NOW + 65)}
    assert record["gp"] == store._keys.status_partition(status, store._keys.digest(S))


def test_retry_leaves_a_tombstone_keeping_the_token(store: DynamoDBStore) -> None:
    token = uncertain(store)
    assert store.resolve_uncertain(S, resolution="retry", now=NOW + 5)
    tombstone = item(store, "record")
    assert tombstone is not None and set(tombstone) == {"pk", "tk", "gc"}
    assert tombstone["tk"] == {"N": str(token)}
