"""The held connections' command packing (``stores/redis/_direct.py``): hiredis packs the
hot path's commands in one C call, and the bytes it sends are the ones redis-py's own packer
would send, for every argument type the store's scripts take."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.redis import RedisStore

from .._services import REDIS_URL

redis = pytest.importorskip("redis")
hiredis = pytest.importorskip("hiredis")

#: What a claim and a completion send: a script digest, key counts, keys (str), the encoded
#: scope (bytes), timestamps and TTLs (float, int), a request hash, a response (bytes).
ARGS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 3, "it:{07}:0123:r", "it:{07}:p", "it:{07}:t", 1765000000.123456,
     1765000300.5, 604800000, b"4:acme|15:payments.charge|3:k\xc3\xa9", "f" * 64),
    ("EVALSHA", "b" * 40, 4, "cl\u00e9", "k2", "k3", "k4", 12345678901234567, b"\x00\xff{}",
     0.1, 1e22, -0.0, 7, ""),
    ("HMGET", "k", "st", "tk"),
]


@pytest.fixture
def store() -> Any:
    s = RedisStore(REDIS_URL, prefix=f"pk_{uuid.uuid4().hex[:10]}")
    s.create_schema()
    try:
        yield s
    finally:
        s.drop_schema()
        s.close()


@pytest.mark.parametrize("args", ARGS, ids=["claim", "completion", "read"])
def test_hiredis_packs_the_bytes_redis_py_would_send(store: Any, args: tuple[Any, ...]) -> None:
    direct = store._transport.direct
    assert direct is not None and direct._pack is not None
    expected = b"".join(redis.Connection().pack_command(*args))
    assert direct._pack(args) == expected


def test_a_command_name_with_a_space_goes_through_redis_py(store: Any) -> None:
    direct = store._transport.direct
    sha = direct.execute("SCRIPT LOAD", "return 41 + 1")
    assert direct.execute("EVALSHA", sha, 0) == 42


def test_a_client_with_another_encoding_keeps_redis_py_packing() -> None:
    client = redis.Redis.from_url(REDIS_URL, encoding="latin-1")
    store = RedisStore(client, prefix=f"pk_{uuid.uuid4().hex[:10]}")
    try:
        assert store._transport.direct._pack is None
        scope = Scope("t", "op", "k")
        first = store.create(scope, request_hash="h", now=1.0, lease_expires_at=2.0)
        again = store.create(scope, request_hash="h", now=1.5, lease_expires_at=2.5)
        assert first.created and not again.created
        assert again.record.fencing_token == first.record.fencing_token
    finally:
        store.drop_schema()
        store.close()
        client.close()


def test_timestamps_and_keys_round_trip_through_the_packed_claim(store: Any) -> None:
    scope = Scope("t\u00e9", "op", "k\u2603")
    now = 1765000000.123456
    token = store.create(scope, request_hash="h", now=now,
                         lease_expires_at=now + 0.1).record.fencing_token
    again = store.create(scope, request_hash="h", now=now, lease_expires_at=now + 1)
    assert not again.created
    assert (again.record.created_at, again.record.lease_expires_at) == (now, now + 0.1)
    assert again.record.fencing_token == token
