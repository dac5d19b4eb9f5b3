"""The store contract (stores/base.py), run against every store: the sync ones and the
async ones (``AsyncSQLStore``, ``AsyncRedisStore``, their coroutines run on a loop of their
own through ``tests._async_stores.SyncStore``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks._core.records import CreateResult, Scope, Status
from idempotent_tasks.stores.base import ClaimRequest, Store, SuccessWrite

from .._async_stores import (
    ASYNC_STORE_KINDS,
    SyncStore,
    async_store_on_a_loop,
)
from ..conftest import STORE_KINDS, drop_store, make_store, unique_prefix


@pytest.fixture(params=STORE_KINDS + ASYNC_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Any]:
    if store_kind not in ASYNC_STORE_KINDS:
        s = make_store(store_kind, tmp_path)
        try:
            yield s
        finally:
            drop_store(s)
        return
    with async_store_on_a_loop(store_kind, unique_prefix("ac")) as (inner, _):
        yield SyncStore(inner)

NOW = 1_700_000_000.0
LEASE = NOW + 30
S = Scope("acme", "payments.charge", "k-1")


def claim(store: Store, scope: Scope = S, now: float = NOW, h: str = "h1") -> CreateResult:
    return store.create(scope, request_hash=h, now=now, lease_expires_at=now + 30)


def token_of(store: Store, scope: Scope = S, now: float = NOW) -> int:
    """Claim ``scope`` (it must be free) and return the new attempt's token."""
    result = claim(store, scope, now=now)
    assert result.created, result
    return result.record.fencing_token


def test_create_then_duplicate_returns_existing_record(store: Store) -> None:
    first = claim(store)
    assert first.created
    assert first.record.status is Status.PROCESSING
    assert first.record.lease_expires_at == LEASE
    assert first.record.expires_at is None
    assert first.record.created_at == NOW and first.record.request_hash == "h1"
    second = claim(store, h="h2")
    assert not second.created
    assert second.record.fencing_token == first.record.fencing_token
    assert second.record.request_hash == "h1"
    got = store.get(S)
    assert got is not None and got.fencing_token == first.record.fencing_token


def test_scopes_are_isolated_without_encoding_collisions(store: Store) -> None:
    scopes = [
        Scope("a:b", "c", "k"),
        Scope("a", "b:c", "k"),
        Scope("a", "b", "c:k"),
        Scope("a|b", "c", "k"),
        Scope("a", "b|c", "k"),
        Scope("t2", "payments.charge", "k-1"),
        Scope("acme", "refunds", "k-1"),
        Scope("acme", "payments.charge", "K-1"),
        Scope("acme", "payments.charge", "k-1"),
    ]
    tokens = [token_of(store, scope) for scope in scopes]
    for token, scope in zip(tokens, scopes, strict=True):
        rec = store.get(scope)
        assert rec is not None and rec.fencing_token == token and rec.scope == scope


def test_metacharacters_in_every_field(store: Store) -> None:
    nasty = Scope("t'; DROP TABLE x; --", "op\" KEYS * {tag}", "k\\%_\u00e9\u202e\U0001f600")
    token = token_of(store, nasty)
    rec = store.get(nasty)
    assert rec is not None and rec.scope == nasty
    assert store.mark_success(nasty, token=token, response=b'{"a": "\\u0000"}', now=NOW, expires_at=NOW + 10)
    got = store.get(nasty)
    assert got is not None and got.response == b'{"a": "\\u0000"}'


def test_mark_success_is_conditional_on_token_and_status(store: Store) -> None:
    t = token_of(store)
    assert not store.mark_success(S, token=t + 99, response=b"1", now=NOW, expires_at=NOW + 100)
    assert store.mark_success(S, token=t, response=b"1", now=NOW + 1, expires_at=NOW + 100)
    rec = store.get(S)
    assert rec is not None
    assert rec.status is Status.SUCCESS and rec.response == b"1"
    assert rec.expires_at == NOW + 100 and rec.updated_at == NOW + 1
    # SUCCESS never changes again
    assert not store.mark_success(S, token=t, response=b"2", now=NOW, expires_at=NOW + 100)
    assert not store.mark_failed(S, token=t, now=NOW, expires_at=NOW + 100)
    assert not store.release(S, token=t)
    assert store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW + 9) is None
    rec2 = store.get(S)
    assert rec2 is not None and rec2.status is Status.SUCCESS and rec2.response == b"1"


def test_mark_failed_and_release_are_conditional(store: Store) -> None:
    t = token_of(store)
    assert not store.mark_failed(S, token=t + 1, now=NOW, expires_at=NOW + 100)
    assert not store.release(S, token=t + 1)
    assert store.mark_failed(S, token=t, now=NOW, expires_at=NOW + 100)
    rec = store.get(S)
    assert rec is not None and rec.status is Status.FAILED and rec.expires_at == NOW + 100
    assert not store.release(S, token=t)


def test_release_keeps_counter_and_allows_recreate(store: Store) -> None:
    t = token_of(store)
    result = store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW + 100)
    assert result is not None and result.retry_count == 1 and not result.poisoned
    assert store.get(S) is None
    assert store.get_retry_count(S) == 1
    t2 = token_of(store)
    assert store.get_retry_count(S) == 1
    assert store.release(S, token=t2)
    assert store.get_retry_count(S) == 1


def test_record_failure_poisons_at_max(store: Store) -> None:
    for attempt in range(1, 4):
        last = token_of(store)
        result = store.record_failure(
            S, token=last, now=NOW + attempt, max_retries=3, expires_at=NOW + 1000
        )
        assert result is not None and result.retry_count == attempt
        assert result.poisoned is (attempt == 3)
    rec = store.get(S)
    assert rec is not None and rec.status is Status.FAILED and rec.fencing_token == last
    assert rec.expires_at == NOW + 1000


def test_record_failure_by_stale_token_counts_nothing(store: Store) -> None:
    t = token_of(store)
    assert store.record_failure(S, token=t + 7, now=NOW, max_retries=3, expires_at=NOW) is None
    assert store.get_retry_count(S) == 0


def test_take_over_needs_expired_lease_and_expected_token(store: Store) -> None:
    t = token_of(store)
    assert store.take_over(S, expected_token=t, now=NOW + 10, lease_expires_at=NOW + 40) is None
    assert store.take_over(S, expected_token=t + 5, now=NOW + 31, lease_expires_at=NOW + 61) is None
    taken = store.take_over(S, expected_token=t, now=NOW + 31, lease_expires_at=NOW + 61)
    assert taken is not None and taken.retry_count == 1 and taken.token > t
    rec = store.get(S)
    assert rec is not None and rec.fencing_token == taken.token and rec.lease_expires_at == NOW + 61
    assert rec.updated_at == NOW + 31 and rec.created_at == NOW
    assert store.get_retry_count(S) == 1
    # the stale owner is fenced off
    assert not store.mark_success(S, token=t, response=b"old", now=NOW + 32, expires_at=NOW + 99)
    assert not store.heartbeat(S, token=t, now=NOW + 32, lease_expires_at=NOW + 99)
    assert store.mark_success(S, token=taken.token, response=b"new", now=NOW + 33, expires_at=NOW + 99)
    # a second take over of the same attempt fails
    assert store.take_over(S, expected_token=t, now=NOW + 99, lease_expires_at=NOW + 200) is None


def test_heartbeat_extends_lease(store: Store) -> None:
    t = token_of(store)
    assert store.heartbeat(S, token=t, now=NOW + 20, lease_expires_at=NOW + 50)
    rec = store.get(S)
    assert rec is not None and rec.lease_expires_at == NOW + 50 and rec.updated_at == NOW + 20
    assert store.take_over(S, expected_token=t, now=NOW + 31, lease_expires_at=NOW + 61) is None


def test_expired_record_counts_as_absent_and_resets_counter(store: Store) -> None:
    t = token_of(store)
    store.record_failure(S, token=t, now=NOW, max_retries=1, expires_at=NOW + 100)
    assert store.get_retry_count(S) == 1
    assert not claim(store, now=NOW + 99).created
    again = claim(store, now=NOW + 100, h="other")
    assert again.created and again.record.request_hash == "other"
    assert again.record.fencing_token > t
    assert store.get_retry_count(S) == 0


def test_concurrent_create_exactly_one_wins(store: Store) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[CreateResult] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        r = claim(store)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.created for r in results].count(True) == 1
    assert len({r.record.fencing_token for r in results}) == 1  # every loser saw the winner


def test_create_many_mixes_created_and_duplicates(store: Store) -> None:
    b = token_of(store, Scope("acme", "op", "b"))
    claims = [ClaimRequest(Scope("acme", "op", k), "h") for k in "abc"]
    results = store.create_many(claims, now=NOW, lease_expires_at=LEASE)
    assert [r.created for r in results] == [True, False, True]
    assert [r.record.scope.key for r in results] == ["a", "b", "c"]
    assert results[1].record.fencing_token == b
    for r in (results[0], results[2]):
        got = store.get(r.record.scope)
        assert got is not None and got.fencing_token == r.record.fencing_token
        assert r.record.request_hash == "h" and r.record.lease_expires_at == LEASE
    assert len({r.record.fencing_token for r in results}) == 3


def test_mark_success_many_writes_each_owned_scope_and_refuses_the_rest(store: Store) -> None:
    ours, stale, done, absent = (Scope("acme", "op", k) for k in ("ours", "stale", "done", "absent"))
    nasty = Scope("a:b|{c}", "op'; --", "k\x7f€")
    t_ours, t_stale, t_done, t_nasty = (token_of(store, s) for s in (ours, stale, done, nasty))
    assert store.mark_success(done, token=t_done, response=b"first", now=NOW, expires_at=NOW + 9)
    writes = [
        SuccessWrite(ours, t_ours, b'{"n":1}', NOW + 50),
        SuccessWrite(stale, t_stale + 1000, b"stale", NOW + 50),  # another attempt's token
        SuccessWrite(done, t_done, b"again", NOW + 50),  # no longer PROCESSING
        SuccessWrite(absent, t_ours, b"none", NOW + 50),
        SuccessWrite(nasty, t_nasty, b"\x00\xff", NOW + 60),
    ]
    assert store.mark_success_many(writes, now=NOW + 1) == [True, False, False, False, True]
    got = store.get(ours)
    assert got is not None and got.status is Status.SUCCESS and got.response == b'{"n":1}'
    assert got.updated_at == NOW + 1 and got.expires_at == NOW + 50 and got.lease_expires_at is None
    other = store.get(nasty)
    assert other is not None and other.response == b"\x00\xff" and other.expires_at == NOW + 60
    still = store.get(stale)
    assert still is not None and still.status is Status.PROCESSING and still.fencing_token == t_stale
    kept = store.get(done)
    assert kept is not None and kept.response == b"first"
    assert store.get(absent) is None
    assert store.mark_success_many([], now=NOW) == []


def test_find_stuck_and_heartbeat_filter(store: Store) -> None:
    claim(store, Scope("t", "op", "a"), now=NOW)
    claim(store, Scope("t", "op", "b"), now=NOW + 5)
    claim(store, Scope("t", "op", "c"), now=NOW + 100)
    stuck = store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=10)
    assert [r.scope.key for r in stuck] == ["a", "b"]
    assert [r.scope.key for r in store.find_stuck(now=NOW + 40, heartbeat_before=NOW + 1, limit=10)] == ["a"]
    assert len(store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=1)) == 1


def test_recovery_primitives_respect_live_leases(store: Store) -> None:
    t = token_of(store)
    assert not store.mark_failed(S, token=t, now=NOW + 1, expires_at=NOW + 9, only_if_lease_expired=True)
    assert store.record_failure(
        S, token=t, now=NOW + 1, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
    ) is None
    res = store.record_failure(
        S, token=t, now=NOW + 31, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
    )
    assert res is not None and res.retry_count == 1 and not res.poisoned


def test_delete_expired_purges_records_and_stale_counters(store: Store) -> None:
    a, b, c = Scope("t", "op", "a"), Scope("t", "op", "b"), Scope("t", "op", "c")
    store.mark_success(a, token=token_of(store, a), response=b"1", now=NOW, expires_at=NOW + 10)
    store.mark_success(b, token=token_of(store, b), response=b"1", now=NOW, expires_at=NOW + 1000)
    store.record_failure(c, token=token_of(store, c), now=NOW, max_retries=5, expires_at=NOW + 10)  # released, counter 1
    assert store.delete_expired(now=NOW + 20, counters_before=NOW - 1, limit=100) == 1
    assert store.get(a) is None and store.get(b) is not None
    assert store.get_retry_count(c) == 1  # changed too recently
    store.delete_expired(now=NOW + 20, counters_before=NOW + 1, limit=100)
    assert store.get_retry_count(c) == 0


def test_delete_expired_respects_limit(store: Store) -> None:
    for i in range(5):
        sc = Scope("t", "op", str(i))
        store.mark_success(sc, token=token_of(store, sc), response=b"1", now=NOW, expires_at=NOW + 1)
    assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 3
    assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 2


def test_operator_primitives(store: Store) -> None:
    t = token_of(store)
    store.mark_failed(S, token=t, now=NOW, expires_at=NOW + 100)
    store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW)  # no-op: FAILED
    assert store.delete_record(S, status=Status.SUCCESS) is None
    deleted = store.delete_record(S, status=Status.FAILED)
    assert deleted is not None and deleted.status is Status.FAILED
    assert store.get(S) is None
    store.reset_retry_count(S)
    assert store.get_retry_count(S) == 0


def test_list_records_and_stats(store: Store) -> None:
    tokens = [token_of(store, Scope("t", op, str(i)), now=NOW + i) for i, op in enumerate("aab")]
    store.mark_failed(Scope("t", "a", "1"), token=tokens[1], now=NOW, expires_at=NOW + 100)
    rows = store.list_records(limit=10)
    assert [r.scope.key for r in rows] == ["0", "1", "2"]
    assert [r.scope.key for r in store.list_records(status=Status.FAILED)] == ["1"]
    assert [r.scope.key for r in store.list_records(operation="a", limit=1, offset=1)] == ["1"]
    assert dict(store.stats()) == {("a", Status.PROCESSING): 1, ("a", Status.FAILED): 1, ("b", Status.PROCESSING): 1}


def test_maintenance_lock(store: Store) -> None:
    assert store.acquire_lock("recover", owner="w1", now=NOW, ttl=10)
    assert not store.acquire_lock("recover", owner="w2", now=NOW + 5, ttl=10)
    assert store.acquire_lock("recover", owner="w1", now=NOW + 5, ttl=10)  # extend
    assert store.acquire_lock("cleanup", owner="w2", now=NOW + 5, ttl=10)
    assert store.acquire_lock("recover", owner="w2", now=NOW + 16, ttl=10)  # expired
    store.release_lock("recover", owner="w1")  # not ours any more: no effect
    assert not store.acquire_lock("recover", owner="w3", now=NOW + 17, ttl=10)
    store.release_lock("recover", owner="w2")
    assert store.acquire_lock("recover", owner="w3", now=NOW + 17, ttl=10)


def test_create_schema_is_idempotent(store: Store) -> None:
    store.create_schema()
    store.create_schema()
    assert claim(store).created


# -- fencing tokens: the store picks them, monotonic per scope, unique per attempt -------------
def _expired(store: Store, scope: Scope, token: int, now: float) -> None:
    """Finish the attempt ``token`` of ``scope`` with a record that has expired at ``now``."""
    assert store.mark_success(scope, token=token, response=b"1", now=now - 10, expires_at=now)


def test_fencing_tokens_grow_across_every_kind_of_new_attempt(store: Store) -> None:
    """(a) first claim, (b) release + claim, (c) record_failure (released) + claim,
    (d) take_over, (e) replacement of an expired record, (f) create_many."""
    seen = [token_of(store)]  # (a)
    assert store.release(S, token=seen[-1])
    seen.append(token_of(store))  # (b)
    failed = store.record_failure(S, token=seen[-1], now=NOW, max_retries=5, expires_at=NOW)
    assert failed is not None and not failed.poisoned
    seen.append(token_of(store))  # (c)
    taken = store.take_over(S, expected_token=seen[-1], now=NOW + 31, lease_expires_at=NOW + 61)
    assert taken is not None
    seen.append(taken.token)  # (d)
    _expired(store, S, seen[-1], NOW + 100)
    replaced = claim(store, now=NOW + 100)
    assert replaced.created
    seen.append(replaced.record.fencing_token)  # (e)
    _expired(store, S, seen[-1], NOW + 200)
    [batch] = store.create_many([ClaimRequest(S, "h1")], now=NOW + 200, lease_expires_at=NOW + 230)
    assert batch.created
    seen.append(batch.record.fencing_token)  # (f): replacing an expired record
    assert store.release(S, token=seen[-1])
    [fresh] = store.create_many([ClaimRequest(S, "h1")], now=NOW + 300, lease_expires_at=NOW + 330)
    assert fresh.created
    seen.append(fresh.record.fencing_token)  # (f): a fresh claim
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen
    got = store.get(S)
    assert got is not None and got.fencing_token == seen[-1]


def test_fencing_token_of_a_duplicate_is_the_owners_and_draws_nothing(store: Store) -> None:
    first = token_of(store)
    for _ in range(3):
        again = claim(store)
        assert not again.created and again.record.fencing_token == first
    [dup] = store.create_many([ClaimRequest(S, "h1")], now=NOW, lease_expires_at=LEASE)
    assert not dup.created and dup.record.fencing_token == first
    assert store.take_over(S, expected_token=first, now=NOW + 1, lease_expires_at=LEASE) is None
    got = store.get(S)
    assert got is not None and got.fencing_token == first


def test_fencing_tokens_never_repeat_across_many_scopes(store: Store) -> None:
    scopes = [Scope("t", "fencing", f"k{i}") for i in range(60)]
    tokens = [token_of(store, s) for s in scopes[:20]]
    results = store.create_many(
        [ClaimRequest(s, "h") for s in scopes[20:]], now=NOW, lease_expires_at=LEASE
    )
    assert all(r.created for r in results)
    tokens += [r.record.fencing_token for r in results]
    for scope, token in zip(scopes[:10], tokens[:10], strict=True):
        taken = store.take_over(scope, expected_token=token, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.token > token
        tokens.append(taken.token)
    assert len(set(tokens)) == len(tokens)
    for scope, token in zip(scopes[10:], tokens[10:60], strict=True):
        got = store.get(scope)
        assert got is not None and got.fencing_token == token


def test_fencing_concurrent_claims_of_one_scope_one_created(store: Store) -> None:
    n = 8
    winning: list[int] = []
    for round_ in range(3):  # the scope free, then released, then expired
        now = NOW + 100 * round_
        barrier = threading.Barrier(n)
        results: list[CreateResult] = []
        lock = threading.Lock()

        def worker(
            now: float, barrier: threading.Barrier, results: list[CreateResult], lock: Any
        ) -> None:
            barrier.wait(timeout=30)
            r = claim(store, now=now)
            with lock:
                results.append(r)

        args = (now, barrier, results, lock)
        threads = [threading.Thread(target=worker, args=args) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if r.created]
        assert len(results) == n and len(winners) == 1
        token = winners[0].record.fencing_token
        assert all(r.record.fencing_token == token for r in results)
        winning.append(token)
        if round_ == 0:
            assert store.release(S, token=token)
        else:
            _expired(store, S, token, now + 100)
    assert winning == sorted(set(winning))
