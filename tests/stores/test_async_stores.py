"""What only the async stores need beyond the contract: failing closed on an unreachable or
silent server exactly like the sync stores, a missing schema, transactional coroutine bodies,
and records shared with their sync twins."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, Status

from .._proxy import TCPProxy
from .._services import POSTGRES_URL, REDIS_URL, require
from .._wait import budget

OP = "payments.charge"
#: A call on a silent link must fail closed well within this (its deadline is 0.5 s).
FAIL_FAST = budget(8.0)  # scaled for a loaded machine


class Body:
    def __init__(self, result: Any = "ok") -> None:
        self.runs = 0
        self.result = result

    async def __call__(self) -> Any:
        self.runs += 1
        return self.result


def _prefix() -> str:
    return f"as_{uuid.uuid4().hex[:10]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_url(port: int | None = None) -> str:
    url = sa.make_url(POSTGRES_URL)
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return url.render_as_string(hide_password=False)


def _store(kind: str, port: int | None = None, **kw: Any) -> Any:
    if kind == "async_postgres":
        require("postgres")
        from idempotent_tasks import AsyncSQLStore

        return AsyncSQLStore(_pg_url(port), table_prefix=_prefix(), **kw)
    require("redis")
    from idempotent_tasks import AsyncRedisStore

    db = REDIS_URL.rsplit("/", 1)[-1] or "0"
    url = REDIS_URL if port is None else f"redis://127.0.0.1:{port}/{db}"
    return AsyncRedisStore(url, prefix=_prefix(), **kw)


def _handler(store: Any) -> IdempotencyHandler:
    return IdempotencyHandler(store, metrics=None, outcome_retry_timeout=0.2)


def _kw(key: str) -> dict[str, Any]:
    return {"operation": OP, "tenant": "acme", "key": key, "payload": {"n": 1}}


KINDS = ["async_postgres", "async_redis"]
TIMEOUTS = {
    "async_postgres": {"connect_timeout": 1.0, "socket_timeout": 0.5},
    "async_redis": {"connect_timeout": 1.0, "socket_timeout": 0.5},
}


@pytest.mark.parametrize("kind", KINDS)
def test_unreachable_store_fails_closed_and_the_body_does_not_run(kind: str) -> None:
    store = _store(kind, _free_port(), **TIMEOUTS[kind])
    body = Body()

    async def main() -> None:
        h = _handler(store)
        outcome = await h.run_async(body, **_kw("down"))
        assert (outcome.kind, outcome.error_code) == (
            "store_unavailable", ErrorCode.STORE_UNAVAILABLE,
        )
        with pytest.raises(IdempotencyError) as ei:
            await h.execute_async(body, **_kw("down"))
        assert ei.value.code is ErrorCode.STORE_UNAVAILABLE
        await store.close()

    asyncio.run(asyncio.wait_for(main(), budget(30)))
    assert body.runs == 0


@pytest.mark.parametrize("kind", KINDS)
def test_silent_link_fails_closed_within_the_deadline_then_recovers(kind: str) -> None:
    port = 5432 if kind == "async_postgres" else 6379
    require("postgres" if kind == "async_postgres" else "redis")
    proxy = TCPProxy(sa.make_url(POSTGRES_URL if port == 5432 else REDIS_URL).port or port)
    proxy.start()
    store = _store(kind, proxy.port, **TIMEOUTS[kind])
    body = Body()

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        assert await h.execute_async(Body(), **_kw("warm-up")) == "ok"  # a pooled connection
        proxy.set_latency(3600.0)
        started = time.monotonic()
        outcome = await asyncio.wait_for(h.run_async(body, **_kw("silent")), FAIL_FAST)
        assert time.monotonic() - started < FAIL_FAST
        assert outcome.error_code is ErrorCode.STORE_UNAVAILABLE and body.runs == 0
        proxy.set_latency(0.0)
        assert await h.execute_async(body, **_kw("after")) == "ok"  # reconnects by itself
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        proxy.set_latency(0.0)
        proxy.forward()
        proxy.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_dropped_connections_are_replaced(kind: str) -> None:
    require("postgres" if kind == "async_postgres" else "redis")
    target = sa.make_url(POSTGRES_URL if kind == "async_postgres" else REDIS_URL).port
    proxy = TCPProxy(target or (5432 if kind == "async_postgres" else 6379)).start()
    store = _store(kind, proxy.port, **TIMEOUTS[kind])

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        assert await h.execute_async(Body(), **_kw("a")) == "ok"
        proxy.drop()  # every pooled connection dies (a server restart looks like this)
        assert (await h.run_async(Body(), **_kw("b"))).kind == "store_unavailable"
        proxy.forward()
        answers = [(await h.run_async(Body(), **_kw("b"))).kind for _ in range(2)]
        assert answers == ["executed", "replayed"]
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(asyncio.wait_for(main(), budget(60)))
    finally:
        proxy.forward()
        proxy.stop()


def test_missing_schema_is_a_configuration_error() -> None:
    store = _store("async_postgres")
    body = Body()

    async def main() -> None:
        h = _handler(store)
        with pytest.raises(IdempotencyError) as ei:
            await h.execute_async(body, **_kw("k"))
        assert ei.value.code is ErrorCode.CONFIGURATION_ERROR
        assert "idempotent-tasks migrate" in ei.value.message
        await h.create_schema_async()  # the handler's async twin
        await h.create_schema_async()  # idempotent
        assert await h.execute_async(body, **_kw("k")) == "ok"
        await store.drop_schema()
        await store.close()

    asyncio.run(main())
    assert body.runs == 1


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_a_partly_missing_schema_is_refused_on_first_use(driver: str) -> None:
    """The schema is checked whole on first use, as SQLStore does: with the retry counters'
    table dropped, the first call is CONFIGURATION_ERROR naming it and no body runs."""
    require("postgres")
    from idempotent_tasks import AsyncSQLStore, SQLStore

    prefix = _prefix()
    SQLStore(POSTGRES_URL, table_prefix=prefix).create_schema()
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {prefix}_retry_counters")
    engine.dispose()
    url = sa.make_url(POSTGRES_URL).set(drivername=f"postgresql+{driver}")
    store = AsyncSQLStore(url.render_as_string(hide_password=False), table_prefix=prefix)
    body = Body()

    async def main() -> None:
        h = _handler(store)
        try:
            outcome = await h.run_async(body, **_kw("k"))
            assert (outcome.kind, outcome.error_code) == (
                "rejected", ErrorCode.CONFIGURATION_ERROR
            )
            assert f"{prefix}_retry_counters" in (outcome.detail or "")
        finally:
            await store.drop_schema()
            await store.close()

    asyncio.run(main())
    assert body.runs == 0


def _run_pg(test: Callable[[Any, IdempotencyHandler, str], Awaitable[None]]) -> None:
    """``test(store, handler, table)`` with a table of the test's own for the body."""
    store = _store("async_postgres")
    table = f"{store.table_prefix}_ledger"

    async def main() -> None:
        import psycopg

        await store.create_schema()
        conninfo = sa.make_url(POSTGRES_URL).set(drivername="postgresql")
        url = conninfo.render_as_string(hide_password=False)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f"CREATE TABLE {table} (k text PRIMARY KEY)")
            try:
                await test(store, _handler(store), table)
            finally:
                await conn.execute(f"DROP TABLE {table}")
                await store.drop_schema()
                await store.close()

    asyncio.run(main())


async def _ledger(store: Any, table: str) -> list[str]:
    async with store.body_transaction() as tx:
        cur = await tx.connection.execute(f"SELECT k FROM {table} ORDER BY k")
        return [row[0] for row in await cur.fetchall()]


def test_transactional_coroutine_body_commits_with_its_success() -> None:
    async def test(store: Any, h: IdempotencyHandler, table: str) -> None:
        async def body(conn: Any) -> str:
            await conn.execute(f"INSERT INTO {table} VALUES ('paid')")
            return "paid"

        assert (await h.run_async(body, **_kw("k"), transactional=True)).kind == "executed"
        assert (await h.run_async(body, **_kw("k"), transactional=True)).kind == "replayed"
        assert await _ledger(store, table) == ["paid"]

    _run_pg(test)


def test_transactional_failure_rolls_the_body_back_and_is_counted() -> None:
    async def test(store: Any, h: IdempotencyHandler, table: str) -> None:
        async def body(conn: Any) -> None:
            await conn.execute(f"INSERT INTO {table} VALUES ('half')")
            raise RuntimeError("transient")

        out = await h.run_async(body, **_kw("k"), transactional=True)
        assert out.kind == "failed" and isinstance(out.exception, RuntimeError)
        assert await _ledger(store, table) == []
        assert await h.retry_count_async(operation=OP, tenant="acme", key="k") == 1
        assert await h.get_record_async(operation=OP, tenant="acme", key="k") is None

    _run_pg(test)


def test_transactional_body_that_commits_itself_is_poisoned() -> None:
    async def test(store: Any, h: IdempotencyHandler, table: str) -> None:
        async def body(conn: Any) -> str:
            await conn.execute(f"INSERT INTO {table} VALUES ('early')")
            await conn.execute("COMMIT")
            return "x"

        out = await h.run_async(body, **_kw("k"), transactional=True)
        assert (out.kind, out.error_code) == ("poisoned", ErrorCode.CONFIGURATION_ERROR)
        rec = await h.get_record_async(operation=OP, tenant="acme", key="k")
        assert rec is not None and rec.status is Status.FAILED

    _run_pg(test)


def test_transactional_needs_an_async_sql_store() -> None:
    store = _store("async_redis")

    async def main() -> None:
        async def body(conn: Any) -> int:
            return 1

        out = await _handler(store).run_async(body, **_kw("k"), transactional=True)
        assert (out.kind, out.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_async_and_sync_twins_share_their_records(kind: str) -> None:
    """An async web process and a sync worker on one store: same schema, keys, scripts."""
    store = _store(kind)
    if kind == "async_postgres":
        from idempotent_tasks import SQLStore

        twin: Any = SQLStore(POSTGRES_URL, table_prefix=store.table_prefix)
    else:
        from idempotent_tasks import RedisStore

        twin = RedisStore(REDIS_URL, prefix=store.prefix)
    body = Body({"charged": 1})

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        assert await h.execute_async(body, **_kw("k")) == {"charged": 1}
        sync = IdempotencyHandler(twin, metrics=None)
        assert sync.execute(lambda: {"charged": 2}, **_kw("k")) == {"charged": 1}
        assert sync.execute(lambda: "sync", **_kw("s")) == "sync"
        assert (await h.run_async(body, **_kw("s"))).kind == "replayed"
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        twin.close()
    assert body.runs == 1


def test_a_client_passed_in_is_used_as_is_and_stays_open() -> None:
    require("redis")
    import redis.asyncio

    from idempotent_tasks import AsyncRedisStore

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        store = AsyncRedisStore(client, prefix=_prefix())
        body = Body()
        h = _handler(store)
        assert await h.execute_async(body, **_kw("k")) == "ok"
        assert await h.execute_async(body, **_kw("k")) == "ok" and body.runs == 1
        await store.drop_schema()
        await store.close()
        assert await client.ping()  # the caller's client: not closed by the store
        await client.aclose()

    asyncio.run(main())


def test_constructor_arguments_are_checked() -> None:
    from idempotent_tasks import AsyncRedisStore, AsyncSQLStore

    for bad in (
        lambda: AsyncRedisStore("redis://127.0.0.1:6379/0", max_connections=0),
        lambda: AsyncRedisStore("redis://127.0.0.1:6379/0", prefix="bad{tag}"),
        lambda: AsyncRedisStore("redis+cluster://127.0.0.1:7000", wait_replicas=1),
        lambda: AsyncRedisStore(object()),  # type: ignore[arg-type]
        lambda: AsyncSQLStore("sqlite:///x.db"),
        lambda: AsyncSQLStore(POSTGRES_URL, table_prefix="1bad"),
        lambda: AsyncSQLStore(POSTGRES_URL, pool_size=0),
    ):
        with pytest.raises(IdempotencyError) as ei:
            bad()
        assert ei.value.code is ErrorCode.CONFIGURATION_ERROR
