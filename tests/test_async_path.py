"""The engine's async path: no thread hop on an async store, the refusals of the sync calls,
the counter never read on the event loop's thread, the thread-hop path's own executor, and
the ASGI middleware on the native path.

"No thread hop" is proved by forbidding it: while an async store runs, ``asyncio.to_thread``,
``loop.run_in_executor`` (which ``loop.getaddrinfo`` and every executor use) and
``threading.Thread.start`` raise, so any hop would fail the call it belongs to.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryCache,
    MemoryStore,
    Status,
    current_context,
)
from idempotent_tasks._core.offload import THREAD_NAME_PREFIX
from idempotent_tasks.testing import FakeClock, FaultyStore

from ._async_stores import ASYNC_STORE_KINDS, AsyncFaultyStore
from ._services import POSTGRES_URL, REDIS_URL, require

OP = "payments.charge"
fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
Request = fastapi.Request  # resolved by FastAPI from this module's globals


class Flaky(Exception):
    pass


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a thread hop on the async path")


@contextmanager
def no_thread_hop() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(asyncio, "to_thread", _refuse)
        mp.setattr(asyncio.base_events.BaseEventLoop, "run_in_executor", _refuse)
        mp.setattr(threading.Thread, "start", _refuse)
        yield


def _new_store(kind: str) -> Any:
    prefix = f"ap_{uuid.uuid4().hex[:10]}"
    if kind == "async_postgres":
        require("postgres")
        from idempotent_tasks import AsyncSQLStore

        return AsyncSQLStore(POSTGRES_URL, table_prefix=prefix)
    require("redis")
    from idempotent_tasks import AsyncRedisStore

    return AsyncRedisStore(REDIS_URL, prefix=prefix)


def with_store(kind: str, test: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``test(store)`` on a fresh async store (schema made before, dropped after)."""

    async def main() -> None:
        store = _new_store(kind)
        await store.create_schema()
        try:
            await test(store)
        finally:
            await store.drop_schema()
            await store.close()

    asyncio.run(main())


def _kw(key: str, **kw: Any) -> dict[str, Any]:
    return {"operation": OP, "tenant": "acme", "key": key, "payload": {"n": 1}, **kw}


# -- no thread hop --------------------------------------------------------------------------
async def _exercise(h: IdempotencyHandler, clock: FakeClock, store: Any) -> None:
    """Every async call of the handler, each path of the algorithm at least once."""
    seen: list[int] = []

    async def body() -> dict[str, int]:
        seen.append(await current_context().retry_count_async())  # type: ignore[union-attr]
        return {"ok": 1}

    async def flaky() -> None:
        raise Flaky()

    assert await h.execute_async(body, **_kw("a")) == {"ok": 1}  # first delivery
    assert (await h.run_async(body, **_kw("a"))).kind == "replayed"
    assert (await h.run_async(flaky, **_kw("b"))).kind == "failed"  # counted, released
    assert (await h.run_async(body, **_kw("b"))).kind == "executed"
    assert seen == [0, 1]
    batch = await h.run_many_async([_kw("c"), _kw("d")], lambda c: body(), batch_completion=True)
    assert [o.kind for o in batch] == ["executed", "executed"]
    await _crashed_and_recovered(h, clock)
    rec = await h.get_record_async(operation=OP, tenant="acme", key="b")
    assert rec is not None and rec.status is Status.SUCCESS and rec.retry_count == 1
    assert len(await h.list_records_async(limit=10)) >= 4
    assert await h.retry_count_async(operation=OP, tenant="acme", key="b") == 1
    assert (OP, Status.SUCCESS) in await h.record_counts_async()
    assert await h.try_lock_async("job", owner="w1", ttl=10)
    await h.unlock_async("job", owner="w1")
    clock.advance(3601)
    assert await h.cleanup_expired_records_async() >= 4


async def _crashed_and_recovered(h: IdempotencyHandler, clock: FakeClock) -> None:
    """A body held open (its lease renewed by the async heartbeat), a duplicate refused
    meanwhile; an expired lease taken over; a stuck record recovered; unpoisoned."""
    beat = asyncio.Event()
    h._engine.store.before["heartbeat"] = beat.set  # type: ignore[attr-defined]

    async def long_body() -> str:
        await beat.wait()  # the heartbeat task renewed our lease on the loop
        return "long"

    running = asyncio.create_task(h.execute_async(long_body, **_kw("e")))
    assert await running == "long"
    assert (await h.run_async(long_body, **_kw("e"))).kind == "replayed"

    async def stuck() -> None:
        clock.advance(31)  # our own lease expires while we run: a takeover may happen
        raise Flaky()

    await h.run_async(stuck, **_kw("f"))
    assert await h.find_stuck_records_async() == []
    assert await h.recover_stuck_records_async() == 0

    async def bad() -> None:
        raise ValueError("permanent")

    assert (await h.run_async(bad, **_kw("g"), permanent=(ValueError,))).kind == "poisoned"
    old = await h.unpoison_async(operation=OP, tenant="acme", key="g")
    assert old.status is Status.FAILED


@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_async_store_runs_make_no_thread_hop(kind: str) -> None:
    async def test(store: Any) -> None:
        clock = FakeClock()
        faulty = AsyncFaultyStore(store)
        h = IdempotencyHandler(
            faulty, clock=clock, lease_timeout=30, ttl=3600, heartbeat_interval=0.01,
            metrics=None, cache=MemoryCache(clock=clock),
        )
        with no_thread_hop():
            await _exercise(h, clock, faulty)
            if kind == "async_postgres":
                await _transactional(h)
        assert "heartbeat" in faulty.calls

    with_store(kind, test)


async def _transactional(h: IdempotencyHandler) -> None:
    async def body(conn: Any) -> str:
        cur = await conn.execute("SELECT 41 + 1")
        return str((await cur.fetchone())[0])

    out = await h.run_async(body, **_kw("tx"), transactional=True)
    assert (out.kind, out.result) == ("executed", "42")
    assert (await h.run_async(body, **_kw("tx"), transactional=True)).kind == "replayed"


@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_the_async_heartbeat_is_a_task_that_ends_with_the_last_body(kind: str) -> None:
    async def test(store: Any) -> None:
        faulty = AsyncFaultyStore(store)
        beats = asyncio.Event()
        faulty.before["heartbeat"] = beats.set
        h = IdempotencyHandler(faulty, metrics=None, lease_timeout=30, heartbeat_interval=0.01)
        threads = threading.active_count()

        tasks: list[asyncio.Task[Any]] = []

        async def body() -> str:
            await beats.wait()  # renewed by the heartbeat task, on this loop
            tasks.extend(t for t in asyncio.all_tasks()
                         if t.get_name() == "idempotent-tasks-heartbeat")
            return "ok"

        assert await h.execute_async(body, **_kw("k")) == "ok"
        assert len(tasks) == 1
        assert threading.active_count() == threads  # no heartbeat thread
        await asyncio.wait_for(tasks[0], 5)  # it ends by itself once no lease is left

    with_store(kind, test)


def test_the_forbidding_is_real() -> None:
    """The same guard fails the thread-hop path (a sync store under run_async)."""
    h = IdempotencyHandler(MemoryStore(), metrics=None)

    async def main() -> None:
        async def body() -> int:
            return 1

        with no_thread_hop(), pytest.raises(AssertionError, match="thread hop"):
            await h.execute_async(body, **_kw("x"))

    asyncio.run(main())


# -- sync calls on an async store ------------------------------------------------------------
@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_sync_calls_on_an_async_store_name_the_call_to_use(kind: str) -> None:
    async def test(store: Any) -> None:
        h = IdempotencyHandler(store, metrics=None)
        body_runs: list[int] = []

        def body() -> int:
            body_runs.append(1)
            return 1

        with pytest.raises(IdempotencyError) as ei:
            h.execute(body, **_kw("k"))
        assert ei.value.code is ErrorCode.CONFIGURATION_ERROR
        assert "await handler.execute_async(...)" in ei.value.message
        out = h.run(body, **_kw("k"))
        assert out.kind == "rejected" and out.error_code is ErrorCode.CONFIGURATION_ERROR
        [many] = h.run_many([_kw("k")], lambda c: 1)
        assert many.error_code is ErrorCode.CONFIGURATION_ERROR
        assert "run_many_async" in (many.detail or "")
        calls: dict[str, Callable[[], Any]] = {
            "get_record_async": lambda: h.get_record(operation=OP, tenant="acme", key="k"),
            "recover_stuck_records_async": h.recover_stuck_records,
            "cleanup_expired_records_async": h.cleanup_expired_records,
            "create_schema_async": h.create_schema,
            "list_records_async": h.list_records,
            "record_counts_async": h.record_counts,
        }
        for twin, call in calls.items():
            with pytest.raises(IdempotencyError, match=twin) as ce:
                call()
            assert ce.value.code is ErrorCode.CONFIGURATION_ERROR
        assert body_runs == []
        assert await h.get_record_async(operation=OP, tenant="acme", key="k") is None

    with_store(kind, test)


# -- the counter is never read on the loop's thread ------------------------------------------
def test_retry_count_on_the_thread_hop_path_is_never_read_on_the_loop() -> None:
    faulty = FaultyStore(MemoryStore())
    readers: list[str] = []
    faulty.before["get_retry_count"] = lambda: readers.append(threading.current_thread().name)
    h = IdempotencyHandler(faulty, metrics=None)
    got: dict[str, Any] = {}

    async def flaky() -> None:
        raise Flaky()

    async def body() -> str:
        ctx = current_context()
        assert ctx is not None
        with pytest.raises(IdempotencyError) as ei:
            _ = ctx.retry_count  # on the loop's thread: refused, no store call
        got["refusal"] = (ei.value.code, ei.value.message)
        got["calls_after_refusal"] = faulty.calls.count("get_retry_count")
        got["awaited"] = await ctx.retry_count_async()
        return "ok"

    async def main() -> None:
        await h.run_async(flaky, **_kw("k"))
        assert await h.execute_async(body, **_kw("k")) == "ok"

    asyncio.run(main())
    code, message = got["refusal"]
    assert code is ErrorCode.CONFIGURATION_ERROR
    assert "await current_context().retry_count_async()" in message
    assert got["calls_after_refusal"] == 0 and got["awaited"] == 1
    assert readers and all(name.startswith(THREAD_NAME_PREFIX) for name in readers)


def test_retry_count_from_another_thread_of_an_async_body_waits_for_the_loop() -> None:
    """A body on the loop that hands work to a thread: the thread may read the counter."""
    h = IdempotencyHandler(MemoryStore(), metrics=None)

    async def flaky() -> None:
        raise Flaky()

    async def body() -> int:
        ctx = current_context()
        assert ctx is not None
        return await asyncio.to_thread(lambda: ctx.retry_count)

    async def main() -> None:
        await h.run_async(flaky, **_kw("k"))
        await h.run_async(flaky, **_kw("k"))
        assert await h.execute_async(body, **_kw("k")) == 2

    asyncio.run(main())


@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_retry_count_on_an_async_store(kind: str) -> None:
    async def test(store: Any) -> None:
        h = IdempotencyHandler(store, metrics=None)
        seen: list[int] = []

        async def body() -> None:
            ctx = current_context()
            assert ctx is not None
            seen.append(await ctx.retry_count_async())
            if len(seen) < 3:
                raise Flaky()

        with no_thread_hop():
            for _ in range(3):
                await h.run_async(body, **_kw("k"))
        assert seen == [0, 1, 2]

    with_store(kind, test)


def test_sync_path_reads_the_counter_only_when_asked() -> None:
    """The sync hot path stays at one claim and one completion: no counter read unless the
    body asks, and then one, on the body's own thread."""
    faulty = FaultyStore(MemoryStore())
    h = IdempotencyHandler(faulty, metrics=None)
    assert h.execute(lambda: 1, **_kw("a")) == 1
    assert faulty.calls == ["create", "mark_success"]
    faulty.calls.clear()
    assert h.execute(lambda: current_context().retry_count, **_kw("b")) == 0  # type: ignore[union-attr]
    assert faulty.calls == ["create", "get_retry_count", "mark_success"]


def test_async_batch_and_twins_on_a_sync_store() -> None:
    """The async face works on a sync store too (its calls on the handler's executor)."""
    faulty = FaultyStore(MemoryStore())
    h = IdempotencyHandler(faulty, metrics=None)

    async def body(call: dict[str, Any]) -> str:
        return str(call["key"])

    async def main() -> None:
        outcomes = await h.run_many_async([_kw("a"), _kw("b")], body, batch_completion=True)
        assert [(o.kind, o.result) for o in outcomes] == [("executed", "a"), ("executed", "b")]
        assert faulty.calls == ["create_many", "mark_success_many"]
        again = await h.run_many_async([_kw("a")], body)
        assert again[0].kind == "replayed"
        rec = await h.get_record_async(operation=OP, tenant="acme", key="a")
        assert rec is not None and rec.response == "a"
        refused = await h.run_async(lambda conn: body({"key": 1}), **_kw("t"), transactional=True)
        assert refused.error_code is ErrorCode.CONFIGURATION_ERROR

    asyncio.run(main())


# -- the thread-hop path's own executor -------------------------------------------------------
def test_sync_store_calls_run_on_the_handlers_bounded_executor() -> None:
    names: set[str] = set()
    faulty = FaultyStore(MemoryStore())
    faulty.before["create"] = lambda: names.add(threading.current_thread().name)
    h = IdempotencyHandler(faulty, metrics=None, async_executor_threads=2)

    async def body() -> int:
        await asyncio.sleep(0)
        return 1

    async def main() -> None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(asyncio, "to_thread", _refuse)  # never the loop's default pool
            results = await asyncio.gather(
                *(h.execute_async(body, **_kw(f"k{i}")) for i in range(40))
            )
        assert results == [1] * 40

    asyncio.run(main())
    assert names and len(names) <= 2, names
    assert all(n.startswith(THREAD_NAME_PREFIX) for n in names)
    h.close()


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_async_executor_threads_must_be_a_positive_integer(threads: Any) -> None:
    with pytest.raises(IdempotencyError) as ei:
        IdempotencyHandler(MemoryStore(), metrics=None, async_executor_threads=threads)
    assert ei.value.code is ErrorCode.CONFIGURATION_ERROR


def test_a_blocking_cache_runs_on_the_executor_an_in_process_one_inline() -> None:
    where: list[str] = []

    class BlockingCache:
        name = "blocking"

        def get(self, key: str) -> bytes | None:
            where.append(threading.current_thread().name)
            return None

        def set(self, key: str, value: bytes, ttl: float) -> None:
            where.append(threading.current_thread().name)

        def delete(self, key: str) -> None:
            pass

    async def body() -> int:
        return 1

    async def main(cache: Any) -> None:
        h = IdempotencyHandler(MemoryStore(), cache=cache, metrics=None)
        assert await h.execute_async(body, **_kw("k")) == 1
        assert await h.execute_async(body, **_kw("k")) == 1

    asyncio.run(main(BlockingCache()))
    assert where and all(n.startswith(THREAD_NAME_PREFIX) for n in where)
    assert IdempotencyHandler(MemoryStore(), cache=MemoryCache())._engine.cache_mode == "inline"
    assert IdempotencyHandler(MemoryStore(), cache=BlockingCache())._engine.cache_mode == "offload"


# -- the ASGI middleware on the native path -----------------------------------------------------
@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_asgi_middleware_on_an_async_store_makes_no_thread_hop(kind: str) -> None:
    from idempotent_tasks.http import ASGIIdempotencyMiddleware

    async def test(store: Any) -> None:
        h = IdempotencyHandler(store, metrics=None)
        app = fastapi.FastAPI()
        runs: list[int] = []

        @app.post("/charge")
        async def charge(request: Request) -> dict[str, int]:
            runs.append(1)
            count = await request.state.idempotency.retry_count_async()
            return {"charged": len(runs), "retry_count": count}

        app.add_middleware(ASGIIdempotencyMiddleware, handler=h, get_tenant=lambda r: "acme")
        transport = httpx.ASGITransport(app=app)
        headers = {"Idempotency-Key": "k-1"}
        with no_thread_hop():
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                first = await client.post("/charge", json={"a": 1}, headers=headers)
                again = await client.post("/charge", json={"a": 1}, headers=headers)
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json() == {"charged": 1, "retry_count": 0}
        assert again.headers.get("idempotent-replayed") == "true"
        assert runs == [1]

    with_store(kind, test)
