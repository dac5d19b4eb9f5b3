"""The store contract (stores/base.py), run against every store."""

from __future__ import annotations

import threading

from idempotent_tasks._records import Scope, Status
from idempotent_tasks.stores.base import ClaimRequest, Store, SuccessWrite

NOW = 1_700_000_000.0
LEASE = NOW + 30
S = Scope("acme", "payments.charge", "k-1")


def claim(store: Store, scope: Scope = S, token: int = 1, now: float = NOW, h: str = "h1"):
    return store.create(scope, request_hash=h, token=token, now=now, lease_expires_at=now + 30)


def test_create_then_duplicate_returns_existing_record(store: Store) -> None:
    first = claim(store)
    assert first.created
    assert first.record.status is Status.PROCESSING
    assert first.record.fencing_token == 1
    assert first.record.lease_expires_at == LEASE
    assert first.record.expires_at is None
    second = claim(store, token=2, h="h2")
    assert not second.created
    assert second.record.fencing_token == 1
    assert second.record.request_hash == "h1"


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
    for i, scope in enumerate(scopes):
        assert claim(store, scope, token=i + 1).created, scope
    for i, scope in enumerate(scopes):
        rec = store.get(scope)
        assert rec is not None and rec.fencing_token == i + 1 and rec.scope == scope


def test_metacharacters_in_every_field(store: Store) -> None:
    nasty = Scope("t'; DROP TABLE x; --", "op\" KEYS * {tag}", "k\\%_\u00e9\u202e\U0001f600")
    assert claim(store, nasty).created
    rec = store.get(nasty)
    assert rec is not None and rec.scope == nasty
    assert store.mark_success(nasty, token=1, response=b'{"a": "\\u0000"}', now=NOW, expires_at=NOW + 10)
    got = store.get(nasty)
    assert got is not None and got.response == b'{"a": "\\u0000"}'


def test_mark_success_is_conditional_on_token_and_status(store: Store) -> None:
    claim(store)
    assert not store.mark_success(S, token=99, response=b"1", now=NOW, expires_at=NOW + 100)
    assert store.mark_success(S, token=1, response=b"1", now=NOW + 1, expires_at=NOW + 100)
    rec = store.get(S)
    assert rec is not None
    assert rec.status is Status.SUCCESS and rec.response == b"1"
    assert rec.expires_at == NOW + 100 and rec.updated_at == NOW + 1
    # SUCCESS never changes again
    assert not store.mark_success(S, token=1, response=b"2", now=NOW, expires_at=NOW + 100)
    assert not store.mark_failed(S, token=1, now=NOW, expires_at=NOW + 100)
    assert not store.release(S, token=1)
    assert store.record_failure(S, token=1, now=NOW, max_retries=3, expires_at=NOW + 9) is None
    rec2 = store.get(S)
    assert rec2 is not None and rec2.status is Status.SUCCESS and rec2.response == b"1"


def test_mark_failed_and_release_are_conditional(store: Store) -> None:
    claim(store)
    assert not store.mark_failed(S, token=2, now=NOW, expires_at=NOW + 100)
    assert not store.release(S, token=2)
    assert store.mark_failed(S, token=1, now=NOW, expires_at=NOW + 100)
    rec = store.get(S)
    assert rec is not None and rec.status is Status.FAILED and rec.expires_at == NOW + 100
    assert not store.release(S, token=1)


def test_release_keeps_counter_and_allows_recreate(store: Store) -> None:
    claim(store)
    result = store.record_failure(S, token=1, now=NOW, max_retries=3, expires_at=NOW + 100)
    assert result is not None and result.retry_count == 1 and not result.poisoned
    assert store.get(S) is None
    assert store.get_retry_count(S) == 1
    assert claim(store, token=2).created
    assert store.get_retry_count(S) == 1
    assert store.release(S, token=2)
    assert store.get_retry_count(S) == 1


def test_record_failure_poisons_at_max(store: Store) -> None:
    for attempt in range(1, 4):
        assert claim(store, token=attempt).created
        result = store.record_failure(
            S, token=attempt, now=NOW + attempt, max_retries=3, expires_at=NOW + 1000
        )
        assert result is not None and result.retry_count == attempt
        assert result.poisoned is (attempt == 3)
    rec = store.get(S)
    assert rec is not None and rec.status is Status.FAILED and rec.fencing_token == 3
    assert rec.expires_at == NOW + 1000


def test_record_failure_by_stale_token_counts_nothing(store: Store) -> None:
    claim(store)
    assert store.record_failure(S, token=7, now=NOW, max_retries=3, expires_at=NOW) is None
    assert store.get_retry_count(S) == 0


def test_take_over_needs_expired_lease_and_expected_token(store: Store) -> None:
    claim(store)
    assert store.take_over(S, expected_token=1, new_token=2, now=NOW + 10, lease_expires_at=NOW + 40) is None
    assert store.take_over(S, expected_token=5, new_token=2, now=NOW + 31, lease_expires_at=NOW + 61) is None
    assert store.take_over(S, expected_token=1, new_token=2, now=NOW + 31, lease_expires_at=NOW + 61) == 1
    rec = store.get(S)
    assert rec is not None and rec.fencing_token == 2 and rec.lease_expires_at == NOW + 61
    assert store.get_retry_count(S) == 1
    # the stale owner is fenced off
    assert not store.mark_success(S, token=1, response=b"old", now=NOW + 32, expires_at=NOW + 99)
    assert not store.heartbeat(S, token=1, now=NOW + 32, lease_expires_at=NOW + 99)
    assert store.mark_success(S, token=2, response=b"new", now=NOW + 33, expires_at=NOW + 99)
    # a second take over of the same attempt fails
    assert store.take_over(S, expected_token=1, new_token=3, now=NOW + 99, lease_expires_at=NOW + 200) is None


def test_heartbeat_extends_lease(store: Store) -> None:
    claim(store)
    assert store.heartbeat(S, token=1, now=NOW + 20, lease_expires_at=NOW + 50)
    rec = store.get(S)
    assert rec is not None and rec.lease_expires_at == NOW + 50 and rec.updated_at == NOW + 20
    assert store.take_over(S, expected_token=1, new_token=2, now=NOW + 31, lease_expires_at=NOW + 61) is None


def test_expired_record_counts_as_absent_and_resets_counter(store: Store) -> None:
    claim(store)
    store.record_failure(S, token=1, now=NOW, max_retries=1, expires_at=NOW + 100)
    assert store.get_retry_count(S) == 1
    assert not claim(store, token=2, now=NOW + 99).created
    again = claim(store, token=3, now=NOW + 100, h="other")
    assert again.created and again.record.fencing_token == 3 and again.record.request_hash == "other"
    assert store.get_retry_count(S) == 0


def test_concurrent_create_exactly_one_wins(store: Store) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[bool] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        r = claim(store, token=100 + i)
        with lock:
            results.append(r.created)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1


def test_create_many_mixes_created_and_duplicates(store: Store) -> None:
    claim(store, Scope("acme", "op", "b"), token=9)
    claims = [ClaimRequest(Scope("acme", "op", k), "h", token=i) for i, k in enumerate("abc")]
    results = store.create_many(claims, now=NOW, lease_expires_at=LEASE)
    assert [r.created for r in results] == [True, False, True]
    assert [r.record.scope.key for r in results] == ["a", "b", "c"]
    assert results[1].record.fencing_token == 9


def test_mark_success_many_writes_each_owned_scope_and_refuses_the_rest(store: Store) -> None:
    ours, stale, done, absent = (Scope("acme", "op", k) for k in ("ours", "stale", "done", "absent"))
    nasty = Scope("a:b|{c}", "op'; --", "k\x7f€")
    for scope, token in ((ours, 1), (stale, 2), (done, 3), (nasty, 4)):
        claim(store, scope, token=token)
    assert store.mark_success(done, token=3, response=b"first", now=NOW, expires_at=NOW + 9)
    writes = [
        SuccessWrite(ours, 1, b'{"n":1}', NOW + 50),
        SuccessWrite(stale, 99, b"stale", NOW + 50),  # another attempt's token
        SuccessWrite(done, 3, b"again", NOW + 50),  # no longer PROCESSING
        SuccessWrite(absent, 5, b"none", NOW + 50),
        SuccessWrite(nasty, 4, b"\x00\xff", NOW + 60),
    ]
    assert store.mark_success_many(writes, now=NOW + 1) == [True, False, False, False, True]
    got = store.get(ours)
    assert got is not None and got.status is Status.SUCCESS and got.response == b'{"n":1}'
    assert got.updated_at == NOW + 1 and got.expires_at == NOW + 50 and got.lease_expires_at is None
    other = store.get(nasty)
    assert other is not None and other.response == b"\x00\xff" and other.expires_at == NOW + 60
    still = store.get(stale)
    assert still is not None and still.status is Status.PROCESSING and still.fencing_token == 2
    kept = store.get(done)
    assert kept is not None and kept.response == b"first"
    assert store.get(absent) is None
    assert store.mark_success_many([], now=NOW) == []


def test_find_stuck_and_heartbeat_filter(store: Store) -> None:
    claim(store, Scope("t", "op", "a"), token=1, now=NOW)
    claim(store, Scope("t", "op", "b"), token=2, now=NOW + 5)
    claim(store, Scope("t", "op", "c"), token=3, now=NOW + 100)
    stuck = store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=10)
    assert [r.scope.key for r in stuck] == ["a", "b"]
    assert [r.scope.key for r in store.find_stuck(now=NOW + 40, heartbeat_before=NOW + 1, limit=10)] == ["a"]
    assert len(store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=1)) == 1


def test_recovery_primitives_respect_live_leases(store: Store) -> None:
    claim(store)
    assert not store.mark_failed(S, token=1, now=NOW + 1, expires_at=NOW + 9, only_if_lease_expired=True)
    assert store.record_failure(
        S, token=1, now=NOW + 1, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
    ) is None
    res = store.record_failure(
        S, token=1, now=NOW + 31, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
    )
    assert res is not None and res.retry_count == 1 and not res.poisoned


def test_delete_expired_purges_records_and_stale_counters(store: Store) -> None:
    a, b, c = Scope("t", "op", "a"), Scope("t", "op", "b"), Scope("t", "op", "c")
    claim(store, a, token=1)
    store.mark_success(a, token=1, response=b"1", now=NOW, expires_at=NOW + 10)
    claim(store, b, token=2)
    store.mark_success(b, token=2, response=b"1", now=NOW, expires_at=NOW + 1000)
    claim(store, c, token=3)
    store.record_failure(c, token=3, now=NOW, max_retries=5, expires_at=NOW + 10)  # released, counter 1
    assert store.delete_expired(now=NOW + 20, counters_before=NOW - 1, limit=100) == 1
    assert store.get(a) is None and store.get(b) is not None
    assert store.get_retry_count(c) == 1  # changed too recently
    store.delete_expired(now=NOW + 20, counters_before=NOW + 1, limit=100)
    assert store.get_retry_count(c) == 0


def test_delete_expired_respects_limit(store: Store) -> None:
    for i in range(5):
        sc = Scope("t", "op", str(i))
        claim(store, sc, token=i + 1)
        store.mark_success(sc, token=i + 1, response=b"1", now=NOW, expires_at=NOW + 1)
    assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 3
    assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 2


def test_operator_primitives(store: Store) -> None:
    claim(store)
    store.mark_failed(S, token=1, now=NOW, expires_at=NOW + 100)
    store.record_failure(S, token=1, now=NOW, max_retries=3, expires_at=NOW)  # no-op: FAILED
    assert store.delete_record(S, status=Status.SUCCESS) is None
    deleted = store.delete_record(S, status=Status.FAILED)
    assert deleted is not None and deleted.status is Status.FAILED
    assert store.get(S) is None
    store.reset_retry_count(S)
    assert store.get_retry_count(S) == 0


def test_list_records_and_stats(store: Store) -> None:
    for i, op in enumerate(["a", "a", "b"]):
        sc = Scope("t", op, str(i))
        claim(store, sc, token=i + 1, now=NOW + i)
    store.mark_failed(Scope("t", "a", "1"), token=2, now=NOW, expires_at=NOW + 100)
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
