"""Fencing tokens (the store picks them: monotonic per scope, unique per attempt) and the
races: of concurrent callers, exactly one wins each atomic step."""

from __future__ import annotations

from .._core.records import CreateResult, Scope
from ..stores.base import ClaimRequest, Store
from ._common import LEASE, NOW, RACERS, S, claim, expire, race, token_of


class FencingRules:
    """Monotonic, unique fencing tokens."""

    def test_fencing_tokens_grow_across_every_kind_of_new_attempt(self, store: Store) -> None:
        """(a) first claim, (b) release + claim, (c) record_failure (released) + claim,
        (d) take_over, (e) replacement of an expired record, (f) create_many."""
        seen = [token_of(store)]  # (a)
        assert store.release(S, token=seen[-1])
        seen.append(token_of(store))  # (b)
        failed = store.record_failure(S, token=seen[-1], now=NOW, max_retries=5, expires_at=NOW)
        assert failed is not None and not failed.poisoned
        seen.append(token_of(store))  # (c)
        taken = store.take_over(S, expected_token=seen[-1], now=NOW + 31,
                                lease_expires_at=NOW + 61)
        assert taken is not None
        seen.append(taken.token)  # (d)
        expire(store, S, seen[-1], NOW + 100)
        replaced = claim(store, now=NOW + 100)
        assert replaced.created
        seen.append(replaced.record.fencing_token)  # (e)
        expire(store, S, seen[-1], NOW + 200)
        [batch] = store.create_many([ClaimRequest(S, "h1")], now=NOW + 200,
                                    lease_expires_at=NOW + 230)
        assert batch.created
        seen.append(batch.record.fencing_token)  # (f): replacing an expired record
        assert store.release(S, token=seen[-1])
        [fresh] = store.create_many([ClaimRequest(S, "h1")], now=NOW + 300,
                                    lease_expires_at=NOW + 330)
        assert fresh.created
        seen.append(fresh.record.fencing_token)  # (f): a fresh claim
        assert seen == sorted(seen) and len(set(seen)) == len(seen), seen
        got = store.get(S)
        assert got is not None and got.fencing_token == seen[-1]

    def test_fencing_token_of_a_duplicate_is_the_owners_and_draws_nothing(
        self, store: Store
    ) -> None:
        first = token_of(store)
        for _ in range(3):
            again = claim(store)
            assert not again.created and again.record.fencing_token == first
        [dup] = store.create_many([ClaimRequest(S, "h1")], now=NOW, lease_expires_at=LEASE)
        assert not dup.created and dup.record.fencing_token == first
        assert store.take_over(S, expected_token=first, now=NOW + 1, lease_expires_at=LEASE) \
            is None
        got = store.get(S)
        assert got is not None and got.fencing_token == first

    def test_fencing_tokens_never_repeat_across_many_scopes(self, store: Store) -> None:
        scopes = [Scope("t", "fencing", f"k{i}") for i in range(60)]
        tokens = [token_of(store, s) for s in scopes[:20]]
        results = store.create_many(
            [ClaimRequest(s, "h") for s in scopes[20:]], now=NOW, lease_expires_at=LEASE
        )
        assert all(r.created for r in results)
        tokens += [r.record.fencing_token for r in results]
        for scope, token in zip(scopes[:10], tokens[:10], strict=True):
            taken = store.take_over(scope, expected_token=token, now=NOW + 31,
                                    lease_expires_at=NOW + 61)
            assert taken is not None and taken.token > token
            tokens.append(taken.token)
        assert len(set(tokens)) == len(tokens)
        for scope, token in zip(scopes[10:], tokens[10:60], strict=True):
            got = store.get(scope)
            assert got is not None and got.fencing_token == token


class RaceRules:
    """Concurrent callers, released together by a barrier: each atomic step has one winner."""

    def test_concurrent_create_exactly_one_wins(self, store: Store) -> None:
        results = race(lambda _: claim(store))
        assert [r.created for r in results].count(True) == 1
        assert len({r.record.fencing_token for r in results}) == 1  # every loser saw the winner

    def test_fencing_concurrent_claims_of_one_scope_one_created(self, store: Store) -> None:
        winning: list[int] = []
        for round_ in range(3):  # the scope free, then released, then expired
            now = NOW + 100 * round_

            def claim_at(_: int, now: float = now) -> CreateResult:
                return claim(store, now=now)

            results = race(claim_at)
            winners = [r for r in results if r.created]
            assert len(results) == RACERS and len(winners) == 1
            token = winners[0].record.fencing_token
            assert all(r.record.fencing_token == token for r in results)
            winning.append(token)
            if round_ == 0:
                assert store.release(S, token=token)
            else:
                expire(store, S, token, now + 100)
        assert winning == sorted(set(winning))

    def test_concurrent_take_over_of_one_attempt_exactly_one_wins(self, store: Store) -> None:
        crashed = token_of(store)
        results = race(lambda _: store.take_over(S, expected_token=crashed, now=NOW + 31,
                                               lease_expires_at=NOW + 61))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, results
        assert winners[0].retry_count == 1 and winners[0].token > crashed
        assert store.get_retry_count(S) == 1
        got = store.get(S)
        assert got is not None and got.fencing_token == winners[0].token

    def test_concurrent_completions_of_one_attempt_exactly_one_applies(
        self, store: Store
    ) -> None:
        token = token_of(store)
        applied = race(lambda i: (i, store.mark_success(S, token=token, response=b"%d" % i,
                                                        now=NOW + 1, expires_at=NOW + 99)))
        [winner] = [i for i, done in applied if done]
        got = store.get(S)
        assert got is not None and got.response == b"%d" % winner  # no later write overwrote it
        counted = race(lambda _: store.record_failure(S, token=token, now=NOW + 2,
                                                      max_retries=3, expires_at=NOW + 99))
        assert counted == [None] * RACERS  # SUCCESS: nothing left to count
        assert store.get_retry_count(S) == 0

    def test_concurrent_failures_of_one_attempt_count_once(self, store: Store) -> None:
        token = token_of(store)
        failures = race(lambda _: store.record_failure(S, token=token, now=NOW + 1,
                                                       max_retries=3, expires_at=NOW + 99))
        assert len([f for f in failures if f is not None]) == 1, failures
        assert store.get_retry_count(S) == 1
        assert store.get(S) is None  # released once, by the one that counted

    def test_concurrent_lock_acquisitions_one_owner(self, store: Store) -> None:
        acquired = race(lambda i: (i, store.acquire_lock("recover", owner=f"w{i}", now=NOW,
                                                         ttl=10)))
        winners = [i for i, won in acquired if won]
        assert len(winners) == 1, acquired
        assert not store.acquire_lock("recover", owner="late", now=NOW + 1, ttl=10)
        store.release_lock("recover", owner=f"w{winners[0]}")
        assert store.acquire_lock("recover", owner="late", now=NOW + 1, ttl=10)
