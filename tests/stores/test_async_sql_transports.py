"""AsyncSQLStore's two transports (asyncpg and psycopg's AsyncConnection), each on its
driver's public API: driver selection by URL, body transactions sharing a connection with
plain statements, the statement deadline on a silent link, idle connections the server
closed, prepared statements on and off (``prepare=``), and one deadline timer per store."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, IdempotencyHandler
from tests._wait import budget

from .._proxy import TCPProxy
from .._services import POSTGRES_URL, require

OP = "payments.charge"
FAIL_FAST = budget(8.0)  # a deadline to fail loudly, scaled for a loaded machine
DRIVERS = ["asyncpg", "psycopg"]


def _kw(key: str) -> dict[str, Any]:
    return {"operation": OP, "tenant": "acme", "key": key, "payload": {"n": 1}}


def _handler(store: Any) -> IdempotencyHandler:
    return IdempotencyHandler(store, metrics=None, outcome_retry_timeout=0.2)


async def _ok() -> str:
    return "ok"


def _url(driver: str, port: int | None = None) -> str:
    url = sa.make_url(POSTGRES_URL).set(drivername=f"postgresql+{driver}")
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return url.render_as_string(hide_password=False)


def _store(driver: str, port: int | None = None, **kw: Any) -> Any:
    require("postgres")
    pytest.importorskip(driver)
    from idempotent_tasks import AsyncSQLStore

    return AsyncSQLStore(_url(driver, port), table_prefix=f"at_{uuid.uuid4().hex[:10]}", **kw)


def test_the_url_selects_the_driver() -> None:
    require("postgres")
    from idempotent_tasks import AsyncSQLStore
    from idempotent_tasks.stores.async_sql._plumbing import DEFAULT_DRIVER

    assert AsyncSQLStore(_url("psycopg")).driver == "psycopg"
    assert AsyncSQLStore(_url("asyncpg")).driver == "asyncpg"
    plain = sa.make_url(POSTGRES_URL).set(drivername="postgresql")
    assert AsyncSQLStore(plain.render_as_string(hide_password=False)).driver == DEFAULT_DRIVER


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_connection_serves_plain_statements_again_after_a_body_transaction(
    driver: str,
) -> None:
    store = _store(driver, pool_size=1)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)

        async def body(conn: Any) -> str:
            await conn.execute("SELECT 1")
            return "tx"

        try:
            for i in range(3):
                tx = await h.run_async(body, **_kw(f"t{i}"), transactional=True)
                assert tx.kind == "executed"
                assert (await h.run_async(_ok, **_kw(f"p{i}"))).kind == "executed"
            await store.drop_schema()
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), budget(60)))


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_statement_in_flight_fails_closed_on_a_silent_link_then_recovers(
    driver: str,
) -> None:
    require("postgres")
    proxy = TCPProxy(sa.make_url(POSTGRES_URL).port or 5432).start()
    # the deadline under test, scaled like every test deadline (a loaded runner is slower)
    store = _store(driver, proxy.port, connect_timeout=budget(1.0), socket_timeout=budget(0.5),
                   pool_size=5)

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
            async with asyncio.timeout(budget(30)):  # the pool reconnects (its own backoff)
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


async def _terminate(pid: int) -> None:
    import psycopg

    dsn = sa.make_url(POSTGRES_URL).set(drivername="postgresql")
    async with await psycopg.AsyncConnection.connect(
        dsn.render_as_string(hide_password=False), autocommit=True
    ) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_idle_connection_the_server_closed_is_replaced(driver: str) -> None:
    """asyncpg reads the server's goodbye while idle: the next call gets a new connection.
    psycopg learns it on the next statement, which fails closed (like SQLStore after a
    restart); the call after it works."""
    store = _store(driver, pool_size=1)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        try:
            assert (await h.run_async(_ok, **_kw("a"))).kind == "executed"
            (held,) = store._conns._idle
            conn = held.conn
            pid = conn.get_server_pid() if driver == "asyncpg" else conn.info.backend_pid
            await _terminate(pid)
            if driver == "asyncpg":
                async with asyncio.timeout(budget(10)):
                    while store._transport.usable(conn):
                        await asyncio.sleep(0.01)
            kinds = [(await h.run_async(_ok, **_kw(f"b{i}"))).kind for i in range(2)]
            expected = ["executed"] * 2 if driver == "asyncpg" else ["store_unavailable", "executed"]
            assert kinds == expected
            await store.drop_schema()
        finally:
            await store.close()

    asyncio.run(main())


async def _named_prepared(store: Any) -> int:
    """Named prepared statements on the store's idle connection."""
    held = store._conns._idle[-1]
    sql = "SELECT count(*) FROM pg_prepared_statements"
    if store.driver == "asyncpg":
        return int(await held.conn.fetchval(sql))
    cur = await held.conn.execute(sql, prepare=False)
    return int((await cur.fetchone())[0])


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("prepare", [True, False])
def test_prepare_false_sends_no_named_prepared_statements(driver: str, prepare: bool) -> None:
    """``prepare=False`` (PgBouncer in transaction mode): nothing named is prepared on the
    server however often a statement runs; ``prepare=True`` does prepare them."""
    store = _store(driver, pool_size=1, prepare=prepare)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        try:
            for i in range(8):
                assert (await h.run_async(_ok, **_kw(f"k{i}"))).kind == "executed"
                assert (await h.run_async(_ok, **_kw(f"k{i}"))).kind == "replayed"
            named = await _named_prepared(store)
            assert (named > 0) if prepare else (named == 0), named
            await store.drop_schema()
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("driver", DRIVERS)
def test_deadlines_cost_no_timer_per_statement(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is one timer per store on the oldest statement in flight: 100
    concurrent deliveries (200 store calls) schedule a handful of the store's own timers
    (whatever the driver schedules for its own waits is the driver's)."""
    store = _store(driver, pool_size=10)

    async def main() -> None:
        await store.create_schema()
        h = _handler(store)
        try:
            warm = await asyncio.gather(*(h.run_async(_ok, **_kw(f"w{i}")) for i in range(10)))
            assert {o.kind for o in warm} == {"executed"}  # every connection open
            loop = asyncio.get_running_loop()
            scheduled: list[float] = []
            call_at = loop.call_at

            def counting(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
                if getattr(callback, "__qualname__", "") == "Watchdog._fire":
                    scheduled.append(when)
                return call_at(when, callback, *args, **kw)

            monkeypatch.setattr(loop, "call_at", counting)  # call_later goes through it too
            kinds = await asyncio.gather(*(h.run_async(_ok, **_kw(f"k{i}")) for i in range(100)))
            monkeypatch.undo()
            assert {o.kind for o in kinds} == {"executed"}
            assert len(scheduled) <= 5, len(scheduled)
            await store.drop_schema()
        finally:
            await store.close()

    asyncio.run(main())
