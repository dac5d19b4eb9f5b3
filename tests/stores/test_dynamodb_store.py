"""DynamoDBStore against moto's DynamoDB server over HTTP (a ``moto_server`` process): what
the shared contract suite does not cover — request counts, tokens across processes, the
index shards, the TTL attribute, error translation, the table, URLs and the CLI.  The
contract suite and the model run on it too (the ``dynamodb`` store kind)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoRegionError
from botocore.stub import Stubber
from click.testing import CliRunner

from idempotent_tasks import (
    ConfigurationError,
    DynamoDBStore,
    IdempotencyHandler,
    Status,
    StoreUnavailableError,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import cli
from idempotent_tasks.stores.base import ClaimRequest, SuccessWrite
from idempotent_tasks.stores.dynamodb import (
    CONFIGURATION_CODES,
    DEFAULT_GC_TTL,
    UNAVAILABLE_CODES,
    translate,
)
from idempotent_tasks.stores.urls import store_from_url
from idempotent_tasks.testing import FakeClock

from .._wait import budget
from ._backends import aws_env, free_port, make_dynamodb_store, moto_endpoint, unique

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


@pytest.fixture
def dynamodb_store() -> Iterator[DynamoDBStore]:
    store = make_dynamodb_store()
    try:
        yield store
    finally:
        store.drop_table()
        store.close()


class Requests:
    """Counts the HTTP requests a client sends, by operation."""

    def __init__(self, client: Any) -> None:
        self.names: list[str] = []
        client.meta.events.register("before-send.dynamodb", self._seen)

    def _seen(self, request: Any, **_: Any) -> None:
        self.names.append(request.headers["X-Amz-Target"].decode().split(".")[-1])

    def during(self, fn: Any) -> list[str]:
        self.names.clear()
        fn()
        return list(self.names)


def claim(store: DynamoDBStore, scope: Scope = S, now: float = NOW, h: str = "h") -> Any:
    return store.create(scope, request_hash=h, now=now, lease_expires_at=now + 30)


def raw_item(store: DynamoDBStore, key: dict[str, Any]) -> dict[str, Any] | None:
    item: dict[str, Any] | None = store.client.get_item(
        TableName=store.table_name, Key=key, ConsistentRead=True).get("Item")
    return item


# -- what each call costs -------------------------------------------------------------------
def test_dynamodb_first_delivery_is_one_put_and_one_update(dynamodb_store: DynamoDBStore) -> None:
    claim(dynamodb_store, Scope("t", "o", "warm"))  # the process's first token block
    seen = Requests(dynamodb_store.client)
    token = 0

    def first() -> None:
        nonlocal token
        token = claim(dynamodb_store).record.fencing_token

    assert seen.during(first) == ["PutItem"]
    assert seen.during(lambda: dynamodb_store.mark_success(
        S, token=token, response=b"1", now=NOW, expires_at=NOW + 9)) == ["UpdateItem"]


def test_dynamodb_duplicate_costs_one_request_and_returns_the_record(
    dynamodb_store: DynamoDBStore,
) -> None:
    first = claim(dynamodb_store)
    seen = Requests(dynamodb_store.client)
    answers: list[Any] = []
    assert seen.during(lambda: answers.append(claim(dynamodb_store, h="other"))) == ["PutItem"]
    assert not answers[0].created and answers[0].record == first.record


def test_dynamodb_batches_send_one_request_per_scope(dynamodb_store: DynamoDBStore) -> None:
    claim(dynamodb_store, Scope("t", "o", "warm"))
    scopes = [Scope("t", "o", f"b{i}") for i in range(40)]
    seen = Requests(dynamodb_store.client)
    results: list[Any] = []
    names = seen.during(lambda: results.extend(dynamodb_store.create_many(
        [ClaimRequest(sc, "h") for sc in scopes], now=NOW, lease_expires_at=NOW + 30)))
    assert names == ["PutItem"] * 40 and all(r.created for r in results)
    writes = [SuccessWrite(sc, r.record.fencing_token, b"1", NOW + 9)
              for sc, r in zip(scopes, results, strict=True)]
    assert dynamodb_store.mark_success_many(writes, now=NOW) == [True] * 40


# -- tokens ---------------------------------------------------------------------------------
def test_dynamodb_tokens_grow_per_scope_across_stores_with_other_blocks(
    dynamodb_store: DynamoDBStore,
) -> None:
    """Two stores on one table draw from different blocks (the second's is newer): a scope
    released by the newer one and claimed again by the older one still gets a greater token,
    because the tombstone keeps the last token and the claim must exceed it."""
    other = DynamoDBStore(dynamodb_store.table_name, endpoint_url=moto_endpoint(),
                          region_name="us-east-1", index_shards=1)
    claim(dynamodb_store, Scope("t", "o", "warm"))  # this store's block first, then other's
    tokens = []
    for store in (other, dynamodb_store, other, dynamodb_store):
        result = claim(store)
        assert result.created
        tokens.append(result.record.fencing_token)
        assert store.release(S, token=result.record.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    other.close()


def _child_tokens(table: str, endpoint: str, out: Any) -> None:
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name="us-east-1", index_shards=1)
    out.put([claim(store, Scope("t", "child", str(i))).record.fencing_token for i in range(5)])


def test_dynamodb_a_forked_child_draws_a_block_of_its_own(dynamodb_store: DynamoDBStore) -> None:
    mine = [claim(dynamodb_store, Scope("t", "parent", str(i))).record.fencing_token
            for i in range(5)]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_tokens, args=(dynamodb_store.table_name, moto_endpoint(),
                                                    out))
    child.start()
    theirs = out.get(timeout=budget(60))
    child.join(budget(30))
    later = [claim(dynamodb_store, Scope("t", "parent", f"x{i}")).record.fencing_token
             for i in range(5)]
    assert not set(mine + later) & set(theirs)


def _claim_one(table: str, endpoint: str, barrier: Any, out: Any) -> None:
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name="us-east-1", index_shards=1)
    claim(store, Scope("t", "o", "warm-" + str(os.getpid())))
    barrier.wait()
    out.put(claim(store).created)


def test_dynamodb_concurrent_claims_from_processes_have_one_winner(
    dynamodb_store: DynamoDBStore,
) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(5), ctx.Queue()
    procs = [ctx.Process(target=_claim_one,
                         args=(dynamodb_store.table_name, moto_endpoint(), barrier, out))
             for _ in range(5)]
    for p in procs:
        p.start()
    created = [out.get(timeout=budget(60)) for _ in procs]
    for p in procs:
        p.join(budget(30))
    assert sorted(created) == [False] * 4 + [True]


# -- items, TTL, index ----------------------------------------------------------------------
def test_dynamodb_counter_item_outlives_its_record(dynamodb_store: DynamoDBStore) -> None:
    keys = dynamodb_store._keys
    digest = keys.digest(S)
    token = claim(dynamodb_store).record.fencing_token
    failure = dynamodb_store.record_failure(S, token=token, now=NOW, max_retries=3,
                                            expires_at=NOW + 9)
    assert failure is not None and not failure.poisoned
    assert dynamodb_store.get(S) is None
    tombstone = raw_item(dynamodb_store, keys.record(digest))
    assert tombstone is not None and set(tombstone) == {"pk", "tk", "gc"}
    counter = raw_item(dynamodb_store, keys.counter(digest))
    assert counter is not None and counter["n"] == {"N": "1"}


def test_dynamodb_reopen_is_one_transaction_of_the_record_and_its_counter(
    dynamodb_store: DynamoDBStore,
) -> None:
    """One ``TransactWriteItems``: the record back in the PROCESSING index partition (no
    response, no expiry) and the counter item deleted; a store whose block is older than the
    settled attempt's token draws a newer block, so the token still grows."""
    keys, digest = dynamodb_store._keys, dynamodb_store._keys.digest(S)
    claim(dynamodb_store, Scope("t", "o", "warm"))  # this store's block first, then other's
    other = DynamoDBStore(dynamodb_store.table_name, endpoint_url=moto_endpoint(),
                          region_name="us-east-1", index_shards=1)
    token = claim(other).record.fencing_token
    failed = other.record_failure(S, token=token, now=NOW, max_retries=1, expires_at=NOW + 9)
    assert failed is not None and failed.poisoned
    seen = Requests(dynamodb_store.client)
    reopened: list[int | None] = []
    names = seen.during(lambda: reopened.append(dynamodb_store.reopen(
        S, expected_token=token, now=NOW + 5, lease_expires_at=NOW + 35)))
    assert names == ["UpdateItem", "PutItem", "TransactWriteItems"]  # a new block, then it
    assert reopened[0] is not None and reopened[0] > token
    item = raw_item(dynamodb_store, keys.record(digest))
    assert item is not None and "rs" not in item and "ex" not in item
    assert item["gp"] == keys.status_partition(Status.PROCESSING, digest)
    assert item["gs"] == {"N": repr(NOW + 5)} and item["le"] == {"N": repr(NOW + 35)}
    assert raw_item(dynamodb_store, keys.counter(digest)) is None
    assert seen.during(lambda: dynamodb_store.reopen(
        S, expected_token=token, now=NOW + 6, lease_expires_at=NOW + 36)) == ["TransactWriteItems"]
    other.close()


def test_dynamodb_ttl_attribute_is_garbage_collection_beyond_the_logical_end(
    dynamodb_store: DynamoDBStore,
) -> None:
    ttl = dynamodb_store.client.describe_time_to_live(TableName=dynamodb_store.table_name)
    assert ttl["TimeToLiveDescription"]["AttributeName"] == "gc"
    token = claim(dynamodb_store).record.fencing_token  # the handler's clock is in 2023
    dynamodb_store.mark_success(S, token=token, response=b"1", now=NOW, expires_at=NOW + 3600)
    item = raw_item(dynamodb_store, dynamodb_store._keys.record(dynamodb_store._keys.digest(S)))
    assert item is not None
    gc = int(item["gc"]["N"])
    assert gc >= time.time() + 3600 + DEFAULT_GC_TTL - 5  # by the wall clock, never past
    rec = dynamodb_store.get(S)
    assert rec is not None and rec.status is Status.SUCCESS  # expiry is the library's


def test_dynamodb_recovery_and_cleanup_read_every_index_shard() -> None:
    store = make_dynamodb_store(index_shards=4)
    try:
        scopes = [Scope("t", "o", f"s{i}") for i in range(24)]
        shards = {store._keys.shard(store._keys.digest(sc)) for sc in scopes}
        assert len(shards) == 4
        for i, sc in enumerate(scopes):
            claim(store, sc, now=NOW + i)
        stuck = store.find_stuck(now=NOW + 100, heartbeat_before=None, limit=10)
        assert [r.scope for r in stuck] == scopes[:10]  # oldest first across shards
        assert len(store.find_stuck(now=NOW + 100, heartbeat_before=NOW + 5, limit=50)) == 5
        for r in store.find_stuck(now=NOW + 100, heartbeat_before=None, limit=50):
            store.mark_success(r.scope, token=r.fencing_token, response=b"1", now=NOW + 100,
                               expires_at=NOW + 101)
        assert store.stats() == {("o", Status.SUCCESS): 24}
        assert store.delete_expired(now=NOW + 200, counters_before=NOW, limit=20) == 20
        assert store.delete_expired(now=NOW + 200, counters_before=NOW, limit=20) == 4
        assert store.list_records(limit=100) == []
    finally:
        store.drop_table()
        store.close()


def test_dynamodb_prefix_isolates_stores_in_one_table(dynamodb_store: DynamoDBStore) -> None:
    other = DynamoDBStore(dynamodb_store.table_name, endpoint_url=moto_endpoint(),
                          region_name="us-east-1", prefix="other", index_shards=1)
    assert claim(dynamodb_store).created and claim(other).created
    assert len(dynamodb_store.list_records()) == 1 and len(other.list_records()) == 1
    assert other.find_stuck(now=NOW + 99, heartbeat_before=None, limit=9)[0].scope == S
    other.close()


def test_dynamodb_never_serves_another_scopes_item(dynamodb_store: DynamoDBStore) -> None:
    """Items are keyed by a digest of the scope; the scope is stored and compared on every
    read, so even a digest collision could not replay another scope's result."""
    keys = dynamodb_store._keys
    claim(dynamodb_store, Scope("t", "o", "real"))
    item = raw_item(dynamodb_store, keys.record(keys.digest(Scope("t", "o", "real"))))
    assert item is not None
    item.update(keys.record(keys.digest(S)))
    dynamodb_store.client.put_item(TableName=dynamodb_store.table_name, Item=item)
    with pytest.raises(StoreUnavailableError, match="share a digest"):
        dynamodb_store.get(S)


# -- the table and errors -------------------------------------------------------------------
def test_dynamodb_missing_table_is_a_configuration_error() -> None:
    store = DynamoDBStore(unique("absent").replace("_", "-"), endpoint_url=moto_endpoint(),
                          region_name="us-east-1")
    with pytest.raises(ConfigurationError, match="create_table"):
        claim(store)


def test_dynamodb_create_table_is_idempotent_and_refuses_another_schema(
    dynamodb_store: DynamoDBStore,
) -> None:
    dynamodb_store.create_table()
    dynamodb_store.create_schema()
    name = unique("foreign").replace("_", "-")
    dynamodb_store.client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    foreign = DynamoDBStore(name, endpoint_url=moto_endpoint(), region_name="us-east-1")
    try:
        with pytest.raises(ConfigurationError, match="does not match"):
            foreign.create_table()
    finally:
        foreign.drop_table()


def test_dynamodb_constructor_never_connects_and_a_dead_endpoint_fails_closed() -> None:
    store = DynamoDBStore("never-made", endpoint_url=f"http://127.0.0.1:{free_port()}",
                          region_name="us-east-1", connect_timeout=1, read_timeout=1)
    assert store._client is None
    with pytest.raises(StoreUnavailableError):
        claim(store)


def _stubbed(code: str) -> DynamoDBStore:
    store = DynamoDBStore("stubbed", endpoint_url=moto_endpoint(), region_name="us-east-1")
    stubber = Stubber(store.client)
    stubber.add_client_error("update_item", service_error_code=code, http_status_code=400)
    stubber.activate()
    store._tokens._next, store._tokens._end = 10, 20  # no token block request first
    store._tokens._taken_at = time.monotonic()
    return store


def test_dynamodb_throttling_fails_closed_as_store_unavailable() -> None:
    """moto never throttles: the service's answer is stubbed on the client (no request)."""
    for code in ("ProvisionedThroughputExceededException", "ThrottlingException"):
        store = _stubbed(code)
        with pytest.raises(StoreUnavailableError, match=code):
            store.heartbeat(S, token=1, now=NOW, lease_expires_at=NOW + 1)


def test_dynamodb_error_translation_is_complete() -> None:
    def client_error(code: str, message: str = "m") -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": message}}, "PutItem")

    for code in CONFIGURATION_CODES:
        assert isinstance(translate("create", "t", client_error(code)), ConfigurationError)
    for code in UNAVAILABLE_CODES | {"SomethingNew"}:
        assert type(translate("create", "t", client_error(code))) is StoreUnavailableError
    assert isinstance(translate("x", "t", client_error("ValidationException", "no index")),
                      ConfigurationError)
    too_big = client_error("ValidationException", "Item size has exceeded the maximum")
    assert type(translate("x", "t", too_big)) is StoreUnavailableError
    assert isinstance(translate("x", "t", NoRegionError()), ConfigurationError)
    lost = EndpointConnectionError(endpoint_url="http://x")
    assert type(translate("x", "t", lost)) is StoreUnavailableError


def test_dynamodb_options_are_checked() -> None:
    for bad in ({"prefix": "a b"}, {"gc_ttl": 0}, {"index_shards": 0}):
        with pytest.raises(ConfigurationError):
            DynamoDBStore("table", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        DynamoDBStore("x")


# -- URLs, the handler, the CLI ---------------------------------------------------------------
def test_dynamodb_url_builds_the_store(dynamodb_store: DynamoDBStore) -> None:
    url = f"dynamodb://{dynamodb_store.table_name}?region=us-east-1&endpoint_url={moto_endpoint()}"
    store = store_from_url(url, prefix="viaurl")
    assert isinstance(store, DynamoDBStore) and store.prefix == "viaurl"
    assert claim(store).created
    with pytest.raises(ConfigurationError):
        store_from_url("dynamodb://t?colour=red")


def test_dynamodb_handler_replays_and_poisons_end_to_end(dynamodb_store: DynamoDBStore) -> None:
    handler = IdempotencyHandler(dynamodb_store, metrics=None, clock=FakeClock(NOW),
                                 max_retries=2)
    calls: list[int] = []

    def body() -> dict[str, int]:
        calls.append(1)
        return {"n": len(calls)}

    for _ in range(3):
        assert handler.execute(body, operation="op", tenant="t", key="k") == {"n": 1}

    def flaky() -> None:
        raise RuntimeError("down")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            handler.execute(flaky, operation="op", tenant="t", key="f")
    record = handler.get_record(operation="op", tenant="t", key="f")
    assert record is not None and record.status is Status.FAILED and record.retry_count == 2


def test_dynamodb_cli_migrate_and_inspect() -> None:
    table = unique("cli").replace("_", "-")
    url = f"dynamodb://{table}?region=us-east-1&endpoint_url={moto_endpoint()}"
    runner = CliRunner(env=aws_env())
    try:
        result = runner.invoke(cli, ["--store", url, "migrate"])
        assert result.exit_code == 0, result.output
        store = DynamoDBStore(table, endpoint_url=moto_endpoint(), region_name="us-east-1")
        claim(store)
        shown = runner.invoke(cli, ["--store", url, "inspect", *S, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["status"] == "PROCESSING"
    finally:
        DynamoDBStore(table, endpoint_url=moto_endpoint(), region_name="us-east-1").drop_table()


def _inherited(store: DynamoDBStore, out: Any) -> None:
    out.put((id(store.client), claim(store, Scope("t", "inherited", "k")).created))


def test_dynamodb_store_inherited_across_fork_works_in_both(dynamodb_store: DynamoDBStore) -> None:
    """A forked child builds a client of its own (the parent's sockets are not the child's)
    and a token block of its own, and the parent keeps working."""
    claim(dynamodb_store, Scope("t", "parent", "before"))
    parent_client = id(dynamodb_store.client)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_inherited, args=(dynamodb_store, out))
    child.start()
    child_client, created = out.get(timeout=budget(60))
    child.join(budget(30))
    assert created and child_client != parent_client
    assert claim(dynamodb_store, Scope("t", "parent", "after")).created
    assert id(dynamodb_store.client) == parent_client


def test_dynamodb_cleanup_passes_over_counters_whose_scope_has_a_record(
    dynamodb_store: DynamoDBStore,
) -> None:
    """Found by the model: the oldest counters belong to scopes that still have a record; a
    cleanup with a small limit must pass over them and purge the orphan behind them."""
    live, orphan = Scope("t", "o", "live"), Scope("t", "o", "orphan")
    for i, scope in enumerate((live, live, orphan)):
        token = claim(dynamodb_store, scope, now=NOW + i).record.fencing_token
        dynamodb_store.record_failure(scope, token=token, now=NOW + i, max_retries=9,
                                      expires_at=NOW + 99)
    claim(dynamodb_store, live, now=NOW + 5)  # live has a record again; its counter is older
    assert dynamodb_store.delete_expired(now=NOW + 10, counters_before=NOW + 10, limit=1) == 0
    assert dynamodb_store.get_retry_count(orphan) == 0
    assert dynamodb_store.get_retry_count(live) == 2


def test_dynamodb_a_token_block_is_never_used_twice(dynamodb_store: DynamoDBStore) -> None:
    """moto's ``ADD`` is not atomic under concurrency (it answered duplicates here): a block
    is only used once its marker was written, so a repeated number is passed over."""
    other = DynamoDBStore(dynamodb_store.table_name, endpoint_url=moto_endpoint(),
                          region_name="us-east-1", index_shards=1)
    first = claim(dynamodb_store, Scope("t", "o", "one")).record.fencing_token
    dynamodb_store.client.update_item(  # what a lost update of the counter would leave
        TableName=dynamodb_store.table_name, Key=dynamodb_store._keys.tokens,
        UpdateExpression="ADD nb :back", ExpressionAttributeValues={":back": {"N": "-1"}})
    second = claim(other, Scope("t", "o", "two")).record.fencing_token
    assert second // 1000 != first // 1000 and second > first
    other.close()
