"""RedisCache: the Cache contract on Redis, and bounded failure when Redis is gone."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks.caches import Cache, RedisCache

from ._services import REDIS_URL, require

redis = pytest.importorskip("redis")

pytestmark = pytest.mark.redis


@pytest.fixture
def prefix() -> str:
    return f"ct_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cache(prefix: str) -> Iterator[RedisCache]:
    require("redis")
    c = RedisCache(REDIS_URL, prefix=prefix)
    yield c
    c.close()


@pytest.fixture
def raw(prefix: str) -> Iterator[Any]:
    require("redis")
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    client.close()


def test_is_a_cache() -> None:
    assert isinstance(RedisCache("redis://127.0.0.1:1/0"), Cache)
    assert RedisCache("redis://127.0.0.1:1/0").name == "redis"


def test_get_set_delete(cache: RedisCache) -> None:
    assert cache.get("a") is None
    cache.set("a", b'{"x": 1}\x00\xff', ttl=60)
    assert cache.get("a") == b'{"x": 1}\x00\xff'
    cache.delete("a")
    assert cache.get("a") is None
    cache.delete("never-set")  # no error


def test_ttl_is_set_in_milliseconds_under_the_prefix(
    cache: RedisCache, raw: Any, prefix: str
) -> None:
    cache.set("k", b"v", ttl=10)
    assert 9_000 < raw.pttl(f"{prefix}:k") <= 10_000
    cache.set("short", b"v", ttl=0.0001)  # rounds up to 1 ms, never "no expiry"
    assert raw.pttl(f"{prefix}:short") in (-2, 0, 1)


def test_non_positive_ttl_stores_nothing_and_drops_the_old_entry(cache: RedisCache) -> None:
    cache.set("k", b"old", ttl=60)
    cache.set("k", b"new", ttl=0)
    assert cache.get("k") is None


def test_entries_expire_by_redis_ttl(cache: RedisCache, raw: Any, prefix: str) -> None:
    cache.set("k", b"v", ttl=60)
    raw.pexpire(f"{prefix}:k", 1)  # make Redis expire it now instead of waiting
    deadline = time.monotonic() + 5
    while raw.exists(f"{prefix}:k") and time.monotonic() < deadline:
        time.sleep(0.005)
    assert cache.get("k") is None


def test_prefixes_isolate_caches(prefix: str, raw: Any) -> None:
    require("redis")
    a, b = RedisCache(REDIS_URL, prefix=prefix), RedisCache(REDIS_URL, prefix=prefix + "-b")
    try:
        a.set("k", b"a", ttl=60)
        assert b.get("k") is None
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("call", ["get", "set", "delete"])
def test_dead_cache_raises_within_its_connect_timeout(call: str) -> None:
    cache = RedisCache("redis://127.0.0.1:1/0")  # constructor never connects
    args: tuple[Any, ...] = ("k", b"v", 1) if call == "set" else ("k",)
    start = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        getattr(cache, call)(*args)
    assert time.monotonic() - start < 1.0


def test_stalled_cache_raises_within_its_socket_timeout() -> None:
    with socket.socket() as listener:  # accepts (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        cache = RedisCache(f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
        start = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            cache.get("k")
        elapsed = time.monotonic() - start
    assert elapsed < 1.0  # default socket_timeout is 0.25 s, and nothing is retried


def test_cluster_url_is_not_connected_on_construction() -> None:
    cache = RedisCache("redis+cluster://127.0.0.1:1")
    with pytest.raises((redis.exceptions.RedisError, redis.exceptions.RedisClusterException)):
        cache.get("k")
