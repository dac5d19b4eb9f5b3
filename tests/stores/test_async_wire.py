"""AsyncRedisStore's wire path: redis.asyncio's connections (a bounded pool, replies kept in
step, failing closed).  AsyncSQLStore's transports: tests/stores/test_async_sql_transports.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, IdempotencyHandler

from .._proxy import TCPProxy
from .._services import REDIS_URL, require
from .._wait import budget

OP = "payments.charge"
FAIL_FAST = budget(8.0)  # scaled for a loaded machine


def _kw(key: str) -> dict[str, Any]:
    return {"operation": OP, "tenant": "acme", "key": key, "payload": {"n": 1}}


def _handler(store: Any) -> IdempotencyHandler:
    return IdempotencyHandler(store, metrics=None, outcome_retry_timeout=0.2)


async def _ok() -> str:
    return "ok"


def _redis_url(port: int | None = None, db: int | None = None, query: str = "") -> str:
    url = sa.make_url(REDIS_URL)
    host = url.host or "127.0.0.1"
    return f"redis://{host}:{port or url.port or 6379}/{db if db is not None else url.database or 0}{query}"


def _redis_store(url: str | None = None, **kw: Any) -> Any:
    require("redis")
    from idempotent_tasks import AsyncRedisStore

    return AsyncRedisStore(url or REDIS_URL, prefix=f"aw_{uuid.uuid4().hex[:10]}", **kw)


# -- Redis: redis.asyncio's own connections ------------------------------------------------
def test_concurrent_deliveries_get_their_own_replies_on_a_bounded_pool() -> None:
    require("redis")
    proxy = TCPProxy(sa.make_url(REDIS_URL).port or 6379).start()
    store = _redis_store(_redis_url(proxy.port), max_connections=8)

    async def main() -> None:
        h = _handler(store)
        kinds = await asyncio.gather(*(h.run_async(_ok, **_kw(f"k{i}")) for i in range(200)))
        assert {o.kind for o in kinds} == {"executed"}
        again = await asyncio.gather(*(h.run_async(_ok, **_kw(f"k{i}")) for i in range(200)))
        assert {o.kind for o in again} == {"replayed"}
        assert proxy.accepted <= 8  # never more connections than max_connections
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(asyncio.wait_for(main(), budget(60)))
    finally:
        proxy.stop()


def test_a_cancelled_call_leaves_the_replies_in_step() -> None:
    """A call cancelled while its reply is on the way never hands that reply to the next."""
    store = _redis_store(max_connections=1)

    async def main() -> None:
        h = _handler(store)
        for key in ("a", "b"):
            assert (await h.run_async(_ok, **_kw(key))).kind == "executed"
        first = asyncio.ensure_future(h.get_record_async(operation=OP, tenant="acme", key="a"))
        await asyncio.sleep(0)  # its command is on the connection, its reply not yet read
        first.cancel()
        record = await h.get_record_async(operation=OP, tenant="acme", key="b")
        assert record is not None and record.key == "b"  # never a's reply
        # redis-py may finish a read it started rather than drop the connection: either way
        # the cancelled call got its own reply or none
        assert first.cancelled() or first.result().key == "a"
        await store.drop_schema()
        await store.close()

    asyncio.run(main())


def test_every_call_in_flight_fails_closed_on_a_silent_link_then_recovers() -> None:
    require("redis")
    proxy = TCPProxy(sa.make_url(REDIS_URL).port or 6379).start()
    store = _redis_store(_redis_url(proxy.port), connect_timeout=1.0, socket_timeout=0.5)

    async def main() -> None:
        h = _handler(store)
        assert (await h.run_async(_ok, **_kw("warm"))).kind == "executed"
        proxy.set_latency(3600.0)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(h.run_async(_ok, **_kw(f"s{i}")) for i in range(20))), FAIL_FAST
        )
        assert {o.error_code for o in outcomes} == {ErrorCode.STORE_UNAVAILABLE}
        proxy.set_latency(0.0)
        assert (await h.run_async(_ok, **_kw("after"))).kind == "executed"
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        proxy.set_latency(0.0)
        proxy.stop()


def test_the_url_selects_the_database() -> None:
    require("redis")
    import redis

    store = _redis_store(_redis_url(db=3, query="?client_name=itstore"))

    async def main() -> None:
        assert (await _handler(store).run_async(_ok, **_kw("k"))).kind == "executed"
        await store.close()

    asyncio.run(main())
    check = redis.Redis.from_url(_redis_url(db=3))
    other = redis.Redis.from_url(_redis_url(db=0))
    try:
        pattern = f"{store.prefix}:*"
        assert list(check.scan_iter(match=pattern)) and not list(other.scan_iter(match=pattern))
        from idempotent_tasks import RedisStore

        RedisStore(_redis_url(db=3), prefix=store.prefix).drop_schema()
    finally:
        check.close()
        other.close()


def test_a_refused_handshake_fails_closed() -> None:
    """A user the server does not know: ``AUTH`` is refused, and the store fails closed with
    a configuration error (retrying would never help), the body not run."""
    url = _redis_url().replace("redis://", "redis://no-such-user:not-the-password@")
    store = _redis_store(url, connect_timeout=1.0)

    async def main() -> None:
        outcome = await _handler(store).run_async(_ok, **_kw("k"))
        assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
        assert not outcome.ran
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("url", [
    "rediss://127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/0?protocol=3",
    "redis://127.0.0.1:6379/0?health_check_interval=5",
    "unix:///tmp/no-such-redis.sock",
])
def test_every_url_is_served_by_a_redis_asyncio_client_built_without_connecting(
    url: str,
) -> None:
    import redis.asyncio

    store = _redis_store(url)
    assert type(store.client) is redis.asyncio.Redis  # and nothing was opened: no server
