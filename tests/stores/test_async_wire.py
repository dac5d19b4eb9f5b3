"""The async stores' own wire paths: AsyncRedisStore's pipelined connection (many coroutines'
commands on one socket, replies matched in order) and AsyncSQLStore's statements on libpq
(one reader per connection, one deadline timer per store)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, IdempotencyHandler

from .._proxy import TCPProxy
from .._services import POSTGRES_URL, REDIS_URL, require

OP = "payments.charge"
FAIL_FAST = 8.0


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


# -- Redis: the pipelined connection -------------------------------------------------------
def test_concurrent_commands_share_one_connection_and_get_their_own_replies() -> None:
    require("redis")
    proxy = TCPProxy(sa.make_url(REDIS_URL).port or 6379).start()
    store = _redis_store(_redis_url(proxy.port))

    async def main() -> None:
        assert store._pipe is not None  # a plain URL with hiredis: the pipelined path
        base = f"{store.prefix}:{{x}}"
        await asyncio.gather(*(store._command("SET", f"{base}:{i}", i) for i in range(300)))
        values = await asyncio.gather(*(store._command("GET", f"{base}:{i}") for i in range(300)))
        assert values == [str(i).encode() for i in range(300)]
        h = _handler(store)
        kinds = await asyncio.gather(*(h.run_async(_ok, **_kw(f"k{i}")) for i in range(200)))
        assert {o.kind for o in kinds} == {"executed"}
        assert proxy.accepted == 1  # every command above went over one connection
        await asyncio.gather(*(store._command("DEL", f"{base}:{i}") for i in range(300)))
        await store.drop_schema()
        await store.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        proxy.stop()


def test_an_error_reply_fails_its_own_command_only() -> None:
    store = _redis_store()

    async def main() -> None:
        from redis.exceptions import NoScriptError

        missing = store._command("EVALSHA", "0" * 40, 0)
        replies = await asyncio.gather(
            store._command("PING"), missing, store._command("PING"), return_exceptions=True
        )
        assert replies[0] == replies[2] == b"PONG"
        assert isinstance(replies[1], NoScriptError)
        assert await store._command("PING") == b"PONG"  # the connection is still usable
        await store.close()

    asyncio.run(main())


def test_a_cancelled_command_leaves_the_replies_in_step() -> None:
    store = _redis_store()
    key = f"{store.prefix}:{{c}}"

    async def main() -> None:
        await store._command("SET", f"{key}:a", b"A")
        await store._command("SET", f"{key}:b", b"B")
        first = asyncio.ensure_future(store._command("GET", f"{key}:a"))
        await asyncio.sleep(0)  # it is queued on the connection, its reply not yet read
        first.cancel()
        assert await store._command("GET", f"{key}:b") == b"B"  # never A's reply
        assert first.cancelled()
        await store._command("DEL", f"{key}:a", f"{key}:b")
        await store.close()

    asyncio.run(main())


def test_every_command_in_flight_fails_closed_on_a_silent_link_then_recovers() -> None:
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


def test_the_handshake_selects_the_database_and_names_the_client() -> None:
    require("redis")
    import redis

    name = f"itpipe{uuid.uuid4().hex[:8]}"
    store = _redis_store(_redis_url(db=3, query=f"?client_name={name}"))
    key = f"{store.prefix}:{{h}}"

    async def main() -> None:
        await store._command("SET", key, b"in-db-3")
        await store.close()

    asyncio.run(main())
    check = redis.Redis.from_url(_redis_url(db=3))
    try:
        assert check.get(key) == b"in-db-3"
        assert redis.Redis.from_url(_redis_url(db=0)).exists(key) == 0
        check.delete(key)
    finally:
        check.close()


def test_a_refused_handshake_fails_closed() -> None:
    """The server has no password: ``AUTH`` is refused, and the store fails closed."""
    url = _redis_url().replace("redis://", "redis://:not-the-password@")
    store = _redis_store(url, connect_timeout=1.0)

    async def main() -> None:
        outcome = await _handler(store).run_async(_ok, **_kw("k"))
        assert outcome.error_code is ErrorCode.STORE_UNAVAILABLE
        await store.close()

    asyncio.run(main())


def test_commands_are_packed_exactly_as_redis_py_packs_them() -> None:
    require("redis")
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from idempotent_tasks.stores.async_redis._pipe import pack

    args = ("EVALSHA", "a" * 40, 2, "idem:{ab}:t:o:k", "é-ü", 1733.25, -7, b"\x00\xff", 10**20)
    assert pack(args) == b"".join(Connection().pack_command(*args))
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            pack(("SET", "k", bad))


class _Transport:
    """What a PipedConnection writes to (no socket: the server's replies are fed by hand,
    to produce the replies a real server gives only in states a test cannot bring about)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True


def test_every_error_reply_is_raised_as_redis_py_raises_it_and_out_of_order_data_breaks() -> None:
    """``-LOADING`` (a ConnectionError subclass in redis-py, not a ResponseError) fails its
    command with that exception; the next reply goes to the next command; a reply nobody
    asked for breaks the connection and fails whatever is in flight."""
    require("redis")
    from redis.exceptions import BusyLoadingError, ConnectionError, InvalidResponse

    from idempotent_tasks.stores.async_redis._pipe import PipedConnection

    async def main() -> None:
        conn = PipedConnection(asyncio.get_running_loop(), 5.0, "test")
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        loading, ping = conn.execute(("GET", "k")), conn.execute(("PING",))
        conn.data_received(b"-LOADING Redis is loading the dataset in memory\r\n+PONG\r\n")
        with pytest.raises(BusyLoadingError):
            await loading
        assert await ping == b"PONG"
        pending = conn.execute(("GET", "k"))
        conn.data_received(b"$1\r\nv\r\n:1\r\n")  # one reply too many
        assert await pending == b"v"
        assert transport.aborted and isinstance(conn.broken, InvalidResponse)
        with pytest.raises(InvalidResponse):
            conn.execute(("PING",))
        conn.connection_lost(None)
        assert not isinstance(conn.broken, ConnectionError)  # the first cause is kept

    asyncio.run(main())


@pytest.mark.parametrize("url", [
    "rediss://127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/0?protocol=3",
    "redis://127.0.0.1:6379/0?health_check_interval=5",
])
def test_other_urls_use_redis_py_connections(url: str) -> None:
    store = _redis_store(url)
    assert store._pipe is None and store._held is not None


def test_without_hiredis_the_store_uses_redis_py_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "hiredis", None)  # import hiredis now fails
    store = _redis_store()
    assert store._pipe is None and store._held is not None


# -- PostgreSQL: statements on libpq -------------------------------------------------------
def _pg_store(port: int | None = None, **kw: Any) -> Any:
    require("postgres")
    from idempotent_tasks import AsyncSQLStore

    url = sa.make_url(POSTGRES_URL)
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return AsyncSQLStore(
        url.render_as_string(hide_password=False), table_prefix=f"aw_{uuid.uuid4().hex[:10]}",
        **kw,
    )


def test_a_connection_serves_plain_statements_again_after_a_body_transaction() -> None:
    """One connection: the body transaction runs on psycopg's own waits, then the store's
    statements run on the loop's reader again."""
    store = _pg_store(pool_size=1)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)

        async def body(conn: Any) -> str:
            await conn.execute("SELECT 1")
            return "tx"

        for i in range(3):
            assert (await h.run_async(body, **_kw(f"t{i}"), transactional=True)).kind == "executed"
            assert (await h.run_async(_ok, **_kw(f"p{i}"))).kind == "executed"
        await store.drop_schema()
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_every_statement_in_flight_fails_closed_on_a_silent_link_then_recovers() -> None:
    require("postgres")
    proxy = TCPProxy(sa.make_url(POSTGRES_URL).port or 5432).start()
    store = _pg_store(proxy.port, connect_timeout=1.0, socket_timeout=0.5, pool_size=5)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        try:
            warm = await asyncio.gather(*(h.run_async(_ok, **_kw(f"w{i}")) for i in range(5)))
            assert {o.kind for o in warm} == {"executed"}
            proxy.set_latency(3600.0)
            started = asyncio.get_running_loop().time()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(h.run_async(_ok, **_kw(f"s{i}")) for i in range(5))), FAIL_FAST
            )
            assert asyncio.get_running_loop().time() - started < FAIL_FAST
            assert {o.error_code for o in outcomes} == {ErrorCode.STORE_UNAVAILABLE}
            proxy.set_latency(0.0)
            async with asyncio.timeout(30):  # the pool reconnects (with its own backoff)
                while (await h.run_async(_ok, **_kw("after"))).kind != "executed":
                    await asyncio.sleep(0.2)
            await store.drop_schema()
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        proxy.set_latency(0.0)
        proxy.stop()


def test_an_idle_connection_the_server_closed_is_replaced_not_used() -> None:
    store = _pg_store(pool_size=1)

    async def main() -> None:
        import psycopg

        await store.create_schema()
        h = _handler(store)
        assert (await h.run_async(_ok, **_kw("a"))).kind == "executed"
        (wire,) = store._conns._idle
        pid = wire.conn.info.backend_pid
        dsn = sa.make_url(POSTGRES_URL).set(drivername="postgresql")
        async with await psycopg.AsyncConnection.connect(
            dsn.render_as_string(hide_password=False), autocommit=True
        ) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        async with asyncio.timeout(10):  # the loop reads the server's goodbye while idle
            while not wire.broken:
                await asyncio.sleep(0.01)
        assert (await h.run_async(_ok, **_kw("b"))).kind == "executed"  # a new connection
        await store.drop_schema()
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["async_postgres", "async_redis"])
def test_deadlines_cost_no_timer_per_statement(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is one timer per store (PostgreSQL) or connection (Redis) on the oldest
    call in flight: 100 concurrent deliveries (200 store calls) schedule a handful."""
    store = _pg_store(pool_size=10) if kind == "async_postgres" else _redis_store()

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        warm = await asyncio.gather(*(h.run_async(_ok, **_kw(f"w{i}")) for i in range(10)))
        assert {o.kind for o in warm} == {"executed"}  # every connection open
        loop = asyncio.get_running_loop()
        scheduled: list[float] = []
        call_at = loop.call_at

        def counting(when: float, *args: Any, **kw: Any) -> Any:
            scheduled.append(when)
            return call_at(when, *args, **kw)

        monkeypatch.setattr(loop, "call_at", counting)  # call_later goes through it too
        kinds = await asyncio.gather(*(h.run_async(_ok, **_kw(f"k{i}")) for i in range(100)))
        monkeypatch.undo()
        assert {o.kind for o in kinds} == {"executed"}
        assert len(scheduled) <= 5, len(scheduled)
        await store.drop_schema()
        await store.close()

    asyncio.run(main())
