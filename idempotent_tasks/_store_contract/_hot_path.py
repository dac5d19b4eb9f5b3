"""The rules of the hot path: atomic claims, conditional writes, counters apart from
records, expiry."""

from __future__ import annotations

import inspect

from .._core.records import Scope, Status
from ..stores.base import AsyncStore, Store
from ._common import LEASE, NOW, S, claim, token_of
from ._face import BlockingStore


def _methods(protocol: type) -> list[str]:
    return sorted(n for n in dir(protocol) if not n.startswith("_"))


class HotPathRules:
    """Claims, the writes that are conditional on (PROCESSING, token), and the counter."""

    def test_implements_the_protocol(self, store: Store) -> None:
        protocol: type = Store
        target: object = store
        if isinstance(store, BlockingStore):
            target, protocol = store.async_store, AsyncStore
            plain = [m for m in _methods(AsyncStore)
                     if not inspect.iscoroutinefunction(getattr(target, m, None))]
            assert plain == [], f"not coroutine functions: {plain}"
        missing = [m for m in _methods(protocol) if not callable(getattr(target, m, None))]
        assert missing == [], f"{type(target).__name__} lacks {missing}"
        name = getattr(target, "name", None)
        assert isinstance(name, str) and name, "a store has a name (for metrics and logs)"

    def test_create_then_duplicate_returns_existing_record(self, store: Store) -> None:
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

    def test_an_unknown_scope_has_no_record_and_a_zero_counter(self, store: Store) -> None:
        ghost = Scope("acme", "payments.charge", "never-claimed")
        assert store.get(ghost) is None
        assert store.get_retry_count(ghost) == 0
        assert not store.heartbeat(ghost, token=1, now=NOW, lease_expires_at=LEASE)
        assert not store.mark_success(ghost, token=1, response=b"x", now=NOW, expires_at=LEASE)
        assert not store.release(ghost, token=1)
        assert store.take_over(ghost, expected_token=1, now=NOW, lease_expires_at=LEASE) is None
        assert store.record_failure(ghost, token=1, now=NOW, max_retries=3, expires_at=LEASE) \
            is None
        assert store.get(ghost) is None and store.get_retry_count(ghost) == 0

    def test_scopes_are_isolated_without_encoding_collisions(self, store: Store) -> None:
        scopes = [
            Scope("a:b", "c", "k"), Scope("a", "b:c", "k"), Scope("a", "b", "c:k"),
            Scope("a|b", "c", "k"), Scope("a", "b|c", "k"), Scope("t2", "payments.charge", "k-1"),
            Scope("acme", "refunds", "k-1"), Scope("acme", "payments.charge", "K-1"),
            Scope("acme", "payments.charge", "k-1"),
        ]
        tokens = [token_of(store, scope) for scope in scopes]
        for token, scope in zip(tokens, scopes, strict=True):
            rec = store.get(scope)
            assert rec is not None and rec.fencing_token == token and rec.scope == scope

    def test_metacharacters_in_every_field(self, store: Store) -> None:
        nasty = Scope("t'; DROP TABLE x; --", "op\" KEYS * {tag}", "k\\%_\u00e9\u202e\U0001f600")
        token = token_of(store, nasty)
        rec = store.get(nasty)
        assert rec is not None and rec.scope == nasty
        body = b'{"a": "\\u0000"}'
        assert store.mark_success(nasty, token=token, response=body, now=NOW, expires_at=NOW + 10)
        got = store.get(nasty)
        assert got is not None and got.response == body

    def test_mark_success_is_conditional_on_token_and_status(self, store: Store) -> None:
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
        assert not store.heartbeat(S, token=t, now=NOW + 2, lease_expires_at=NOW + 50)
        assert store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW + 9) is None
        rec2 = store.get(S)
        assert rec2 is not None and rec2.status is Status.SUCCESS and rec2.response == b"1"
        assert store.get_retry_count(S) == 0

    def test_mark_failed_and_release_are_conditional(self, store: Store) -> None:
        t = token_of(store)
        assert not store.mark_failed(S, token=t + 1, now=NOW, expires_at=NOW + 100)
        assert not store.release(S, token=t + 1)
        assert store.mark_failed(S, token=t, now=NOW, expires_at=NOW + 100, response=b"why")
        rec = store.get(S)
        assert rec is not None and rec.status is Status.FAILED and rec.expires_at == NOW + 100
        assert rec.response == b"why"
        assert not store.release(S, token=t)
        assert not claim(store, now=NOW + 1).created  # poisoned, not free

    def test_release_keeps_counter_and_allows_recreate(self, store: Store) -> None:
        t = token_of(store)
        result = store.record_failure(S, token=t, now=NOW, max_retries=3, expires_at=NOW + 100)
        assert result is not None and result.retry_count == 1 and not result.poisoned
        assert store.get(S) is None
        assert store.get_retry_count(S) == 1
        t2 = token_of(store)
        assert store.get_retry_count(S) == 1
        assert store.release(S, token=t2)
        assert store.get_retry_count(S) == 1
        t3 = token_of(store)
        assert store.mark_success(S, token=t3, response=b"1", now=NOW, expires_at=NOW + 100)
        assert store.get_retry_count(S) == 1  # success does not reset it either

    def test_record_failure_poisons_at_max(self, store: Store) -> None:
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

    def test_record_failure_by_stale_token_counts_nothing(self, store: Store) -> None:
        t = token_of(store)
        assert store.record_failure(S, token=t + 7, now=NOW, max_retries=3, expires_at=NOW) is None
        assert store.get_retry_count(S) == 0
        rec = store.get(S)
        assert rec is not None and rec.status is Status.PROCESSING and rec.fencing_token == t

    def test_take_over_needs_expired_lease_and_expected_token(self, store: Store) -> None:
        t = token_of(store)
        assert store.take_over(S, expected_token=t, now=NOW + 10, lease_expires_at=NOW + 40) is None
        assert store.take_over(S, expected_token=t + 5, now=NOW + 31,
                               lease_expires_at=NOW + 61) is None
        taken = store.take_over(S, expected_token=t, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.retry_count == 1 and taken.token > t
        rec = store.get(S)
        assert rec is not None and rec.fencing_token == taken.token
        assert rec.lease_expires_at == NOW + 61
        assert rec.updated_at == NOW + 31 and rec.created_at == NOW
        assert store.get_retry_count(S) == 1
        # the stale owner is fenced off
        assert not store.mark_success(S, token=t, response=b"old", now=NOW + 32,
                                      expires_at=NOW + 99)
        assert not store.heartbeat(S, token=t, now=NOW + 32, lease_expires_at=NOW + 99)
        assert store.mark_success(S, token=taken.token, response=b"new", now=NOW + 33,
                                  expires_at=NOW + 99)
        # a second take over of the same attempt fails
        assert store.take_over(S, expected_token=t, now=NOW + 99,
                               lease_expires_at=NOW + 200) is None

    def test_heartbeat_extends_lease(self, store: Store) -> None:
        t = token_of(store)
        assert not store.heartbeat(S, token=t + 3, now=NOW + 20, lease_expires_at=NOW + 50)
        assert store.heartbeat(S, token=t, now=NOW + 20, lease_expires_at=NOW + 50)
        rec = store.get(S)
        assert rec is not None and rec.lease_expires_at == NOW + 50 and rec.updated_at == NOW + 20
        assert store.take_over(S, expected_token=t, now=NOW + 31, lease_expires_at=NOW + 61) is None

    def test_expired_record_counts_as_absent_and_resets_counter(self, store: Store) -> None:
        t = token_of(store)
        store.record_failure(S, token=t, now=NOW, max_retries=1, expires_at=NOW + 100)
        assert store.get_retry_count(S) == 1
        assert not claim(store, now=NOW + 99).created
        again = claim(store, now=NOW + 100, h="other")
        assert again.created and again.record.request_hash == "other"
        assert again.record.fencing_token > t
        assert store.get_retry_count(S) == 0
