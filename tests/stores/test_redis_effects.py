"""What Redis keeps of the recorded steps and UNCERTAIN records (the rules themselves:
test_kv_effects.py): the steps are a field of the retry counter's hash in the scope's hash
slot, and an UNCERTAIN record and its counter carry no Redis TTL (they wait for an
operator) and sit in the finished index at +inf."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import OutcomeNotRecordedError, Status
from idempotent_tasks.stores.redis import RedisStore

from .._services import REDIS_URL
from ..conftest import drop_store, make_store
from .test_kv_effects import NOW, S, claim, uncertain

redis = pytest.importorskip("redis")
from redis.crc import key_slot  # noqa: E402

pytestmark = pytest.mark.redis


@pytest.fixture
def rstore(tmp_path: Path) -> Iterator[RedisStore]:
    made = make_store("redis", tmp_path)
    assert isinstance(made, RedisStore)
    try:
        yield made
    finally:
        drop_store(made)


@pytest.fixture
def raw() -> Iterator[Any]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def test_steps_are_a_field_of_the_counter_in_the_scopes_slot(
    rstore: RedisStore, raw: Any
) -> None:
    token = claim(rstore)
    assert rstore.save_steps(S, token=token, steps=b"blob", now=NOW)
    k = rstore._keys(S)
    assert raw.hget(k.counter, "s") == b"blob"
    assert key_slot(k.counter.encode()) == key_slot(k.record.encode())  # Cluster-safe
    assert raw.zscore(k.counter_index, k.member) == NOW  # the purge finds the counter
    gc_ms = rstore._protocol.gc_ms
    assert 0 < raw.pttl(k.counter) <= 30 * 1000 + int(gc_ms)  # lease + gc_ttl, as a takeover's


def test_an_uncertain_record_and_its_steps_never_expire_in_redis(
    rstore: RedisStore, raw: Any
) -> None:
    uncertain(rstore)
    k = rstore._keys(S)
    assert (raw.pttl(k.record), raw.pttl(k.counter)) == (-1, -1)
    assert raw.zscore(k.processing, k.member) is None
    assert raw.zscore(k.finished, k.member) == float("inf")  # listed, never due


def test_a_resolution_gives_back_the_ttls_of_a_finished_record(
    rstore: RedisStore, raw: Any
) -> None:
    uncertain(rstore)
    assert rstore.resolve_uncertain(S, resolution="done", now=NOW + 5, response=b"ok",
                                    expires_at=NOW + 65)
    k = rstore._keys(S)
    assert raw.zscore(k.finished, k.member) == NOW + 65
    assert raw.pttl(k.record) > 0 and raw.pttl(k.counter) > 0


def test_retry_hands_the_counter_back_to_garbage_collection(
    rstore: RedisStore, raw: Any
) -> None:
    uncertain(rstore)
    assert rstore.resolve_uncertain(S, resolution="retry", now=NOW + 5)
    k = rstore._keys(S)
    assert raw.zscore(k.finished, k.member) is None and raw.pttl(k.counter) > 0


def test_with_wait_replicas_mark_uncertain_waits_and_save_steps_does_not(
    rstore: RedisStore,
) -> None:
    """On a server with no replica: ``mark_uncertain`` is an outcome write (applied on the
    primary, then OUTCOME_NOT_RECORDED), ``save_steps`` sends no ``WAIT`` at all."""
    waiting = RedisStore(REDIS_URL, prefix=rstore.prefix, wait_replicas=1, wait_timeout=0.05)
    try:
        token = claim(rstore)
        assert waiting.save_steps(S, token=token, steps=b"s", now=NOW)
        with pytest.raises(OutcomeNotRecordedError):
            waiting.mark_uncertain(S, token=token, now=NOW + 1, detail=b"?")
        got = rstore.get(S)
        assert got is not None and got.status is Status.UNCERTAIN
        assert not waiting.mark_uncertain(S, token=token, now=NOW + 2, detail=None)  # no write
    finally:
        waiting.close()
