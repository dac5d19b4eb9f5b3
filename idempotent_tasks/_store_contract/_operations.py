"""The rules of batches, maintenance (recovery, cleanup, named leases) and operators."""

from __future__ import annotations

from .._core.records import Scope, Status
from ..stores.base import ClaimRequest, Store, SuccessWrite
from ._common import LEASE, NOW, S, claim, token_of


class BatchRules:
    """``create_many`` / ``mark_success_many``: each item individually atomic, in order."""

    def test_create_many_mixes_created_and_duplicates(self, store: Store) -> None:
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
        assert store.create_many([], now=NOW, lease_expires_at=LEASE) == []

    def test_mark_success_many_writes_each_owned_scope_and_refuses_the_rest(
        self, store: Store
    ) -> None:
        ours, stale, done, absent = (Scope("acme", "op", k)
                                     for k in ("ours", "stale", "done", "absent"))
        nasty = Scope("a:b|{c}", "op'; --", "k\x7f€")
        t_ours, t_stale, t_done, t_nasty = (token_of(store, s) for s in (ours, stale, done, nasty))
        assert store.mark_success(done, token=t_done, response=b"first", now=NOW,
                                  expires_at=NOW + 9)
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
        assert got.updated_at == NOW + 1 and got.expires_at == NOW + 50
        assert got.lease_expires_at is None
        other = store.get(nasty)
        assert other is not None and other.response == b"\x00\xff" and other.expires_at == NOW + 60
        still = store.get(stale)
        assert still is not None and still.status is Status.PROCESSING
        assert still.fencing_token == t_stale
        kept = store.get(done)
        assert kept is not None and kept.response == b"first"
        assert store.get(absent) is None
        assert store.mark_success_many([], now=NOW) == []

    def test_batches_keep_every_character_and_byte(self, store: Store) -> None:
        """What a batch sends as one piece (a SQL array, a script's arguments) must keep
        each part whole: separators, quotes, escapes and the word NULL are data."""
        keys = ["NULL", "a,b", '{"x"}', "back\\slash\\", " spaced ", "tab\tnew\nline", "é€😀"]
        scopes = [Scope(f"t{i},\\", f'op"{i}', k) for i, k in enumerate(keys)]
        hashes = [f'h"{i}\\' for i in range(len(keys))]
        claims = [ClaimRequest(s, h) for s, h in zip(scopes, hashes, strict=True)]
        results = store.create_many(claims, now=NOW, lease_expires_at=LEASE)
        assert [r.record.scope for r in results] == scopes and all(r.created for r in results)
        responses = [b"", b"\\x00", b'"{}",NULL', bytes(range(256)), b"\x00", b"a", b"\\"]
        writes = [SuccessWrite(s, r.record.fencing_token, body, NOW + 0.1 + i)
                  for i, (s, r, body) in enumerate(zip(scopes, results, responses, strict=True))]
        assert store.mark_success_many(writes, now=NOW + 1) == [True] * len(keys)
        for i, (s, h, body) in enumerate(zip(scopes, hashes, responses, strict=True)):
            got = store.get(s)
            assert got is not None and got.status is Status.SUCCESS, s
            assert (got.request_hash, got.response, got.expires_at) == (h, body, NOW + 0.1 + i)


class MaintenanceRules:
    """Recovery finds expired leases, cleanup purges expired records and stale counters,
    named leases schedule both."""

    def test_find_stuck_and_heartbeat_filter(self, store: Store) -> None:
        claim(store, Scope("t", "op", "a"), now=NOW)
        claim(store, Scope("t", "op", "b"), now=NOW + 5)
        claim(store, Scope("t", "op", "c"), now=NOW + 100)
        stuck = store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=10)
        assert [r.scope.key for r in stuck] == ["a", "b"]
        older = store.find_stuck(now=NOW + 40, heartbeat_before=NOW + 1, limit=10)
        assert [r.scope.key for r in older] == ["a"]
        assert len(store.find_stuck(now=NOW + 40, heartbeat_before=None, limit=1)) == 1

    def test_recovery_primitives_respect_live_leases(self, store: Store) -> None:
        t = token_of(store)
        assert not store.mark_failed(S, token=t, now=NOW + 1, expires_at=NOW + 9,
                                     only_if_lease_expired=True)
        assert store.record_failure(
            S, token=t, now=NOW + 1, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
        ) is None
        res = store.record_failure(
            S, token=t, now=NOW + 31, max_retries=3, expires_at=NOW + 9, only_if_lease_expired=True
        )
        assert res is not None and res.retry_count == 1 and not res.poisoned

    def test_delete_expired_purges_records_and_stale_counters(self, store: Store) -> None:
        a, b, c = Scope("t", "op", "a"), Scope("t", "op", "b"), Scope("t", "op", "c")
        store.mark_success(a, token=token_of(store, a), response=b"1", now=NOW, expires_at=NOW + 10)
        store.mark_success(b, token=token_of(store, b), response=b"1", now=NOW,
                           expires_at=NOW + 1000)
        # released, counter 1
        store.record_failure(c, token=token_of(store, c), now=NOW, max_retries=5,
                             expires_at=NOW + 10)
        assert store.delete_expired(now=NOW + 20, counters_before=NOW - 1, limit=100) == 1
        assert store.get(a) is None and store.get(b) is not None
        assert store.get_retry_count(c) == 1  # changed too recently
        store.delete_expired(now=NOW + 20, counters_before=NOW + 1, limit=100)
        assert store.get_retry_count(c) == 0

    def test_delete_expired_keeps_the_counter_of_a_live_record(self, store: Store) -> None:
        t = token_of(store)
        store.record_failure(S, token=t, now=NOW, max_retries=5, expires_at=NOW + 10)
        token_of(store, now=NOW + 1)  # claimed again: the counter belongs to a live record
        store.delete_expired(now=NOW + 20, counters_before=NOW + 10, limit=100)
        assert store.get_retry_count(S) == 1

    def test_delete_expired_respects_limit(self, store: Store) -> None:
        for i in range(5):
            sc = Scope("t", "op", str(i))
            store.mark_success(sc, token=token_of(store, sc), response=b"1", now=NOW,
                               expires_at=NOW + 1)
        assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 3
        assert store.delete_expired(now=NOW + 2, counters_before=NOW, limit=3) == 2

    def test_maintenance_lock(self, store: Store) -> None:
        assert store.acquire_lock("recover", owner="w1", now=NOW, ttl=10)
        assert not store.acquire_lock("recover", owner="w2", now=NOW + 5, ttl=10)
        assert store.acquire_lock("recover", owner="w1", now=NOW + 5, ttl=10)  # extend
        assert store.acquire_lock("cleanup", owner="w2", now=NOW + 5, ttl=10)
        assert store.acquire_lock("recover", owner="w2", now=NOW + 16, ttl=10)  # expired
        store.release_lock("recover", owner="w1")  # not ours any more: no effect
        assert not store.acquire_lock("recover", owner="w3", now=NOW + 17, ttl=10)
        store.release_lock("recover", owner="w2")
        assert store.acquire_lock("recover", owner="w3", now=NOW + 17, ttl=10)


class AdminRules:
    """What operators and deployments call."""

    def test_operator_primitives(self, store: Store) -> None:
        t = token_of(store)
        store.record_failure(S, token=t, now=NOW, max_retries=5, expires_at=NOW)  # counter 1
        t = token_of(store)
        store.mark_failed(S, token=t, now=NOW, expires_at=NOW + 100)
        store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW)  # no-op: FAILED
        assert store.get_retry_count(S) == 1
        assert store.delete_record(S, status=Status.SUCCESS) is None
        deleted = store.delete_record(S, status=Status.FAILED)
        assert deleted is not None and deleted.status is Status.FAILED
        assert store.get(S) is None
        assert store.get_retry_count(S) == 1  # deleting a record leaves its counter
        store.reset_retry_count(S)
        assert store.get_retry_count(S) == 0

    def test_list_records_and_stats(self, store: Store) -> None:
        tokens = [token_of(store, Scope("t", op, str(i)), now=NOW + i)
                  for i, op in enumerate("aab")]
        store.mark_failed(Scope("t", "a", "1"), token=tokens[1], now=NOW, expires_at=NOW + 100)
        rows = store.list_records(limit=10)
        assert [r.scope.key for r in rows] == ["0", "1", "2"]
        assert [r.scope.key for r in store.list_records(status=Status.FAILED)] == ["1"]
        assert [r.scope.key for r in store.list_records(operation="a", limit=1, offset=1)] == ["1"]
        assert [r.scope.key for r in store.list_records(tenant="nobody")] == []
        assert dict(store.stats()) == {
            ("a", Status.PROCESSING): 1, ("a", Status.FAILED): 1, ("b", Status.PROCESSING): 1,
        }

    def test_create_schema_is_idempotent(self, store: Store) -> None:
        store.create_schema()
        store.create_schema()
        assert claim(store).created
