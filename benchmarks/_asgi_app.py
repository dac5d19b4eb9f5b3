"""The application the HTTP load test serves (``uvicorn benchmarks._asgi_app:app``, 1 worker).

A trivial FastAPI endpoint, ``POST /charge``, behind ``ASGIIdempotencyMiddleware``; the
store comes from the environment, so the same app runs on the native async path and on the
thread-hop path:

* ``IT_BENCH_STORE``: ``async_redis`` / ``async_postgresql`` (native: ``AsyncRedisStore`` /
  ``AsyncSQLStore``) or ``redis`` / ``postgresql`` (``RedisStore`` / ``SQLStore``, whose
  calls run on the handler's executor);
* ``IT_BENCH_PREFIX``: the store's key / table prefix (created at start-up, dropped at
  shutdown);
* ``IT_BENCH_THREADS``: ``async_executor_threads`` for the thread-hop path.

``GET /lag`` reports the event loop's lag since the last ``GET /lag?reset=1``: a task asks
to wake every 5 ms and records how late it woke (a blocked loop wakes it late).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks.http import ASGIIdempotencyMiddleware

from ._services import POSTGRES_URL, REDIS_URL

TICK = 0.005
KIND = os.environ.get("IT_BENCH_STORE", "async_redis")
PREFIX = os.environ.get("IT_BENCH_PREFIX", "bench_http")
THREADS = int(os.environ.get("IT_BENCH_THREADS", "16"))


def _store() -> Any:
    if KIND == "async_redis":
        from idempotent_tasks import AsyncRedisStore

        return AsyncRedisStore(REDIS_URL, prefix=PREFIX)
    if KIND == "async_postgresql":
        from idempotent_tasks import AsyncSQLStore

        return AsyncSQLStore(POSTGRES_URL, table_prefix=PREFIX, pool_size=20)
    if KIND == "redis":
        from idempotent_tasks import RedisStore

        return RedisStore(REDIS_URL, prefix=PREFIX)
    from idempotent_tasks import SQLStore

    return SQLStore(POSTGRES_URL, table_prefix=PREFIX, pool_size=20)


STORE = _store()
HANDLER = IdempotencyHandler(STORE, metrics=None, async_executor_threads=THREADS)
LAGS: list[float] = []


async def _watch_lag() -> None:
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + TICK
        await asyncio.sleep(TICK)
        LAGS.append(max(0.0, loop.time() - expected))


async def _schema(action: str) -> None:
    if inspect.iscoroutinefunction(STORE.create):
        await getattr(STORE, action)()
    else:
        await asyncio.to_thread(getattr(STORE, action))


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await _schema("create_schema")
    watcher = asyncio.create_task(_watch_lag())
    try:
        yield
    finally:
        watcher.cancel()
        await _schema("drop_schema")
        close = STORE.close()
        if asyncio.iscoroutine(close):
            await close


app = FastAPI(lifespan=lifespan)


@app.post("/charge")
async def charge() -> dict[str, Any]:
    return {"charged": True, "at": time.time()}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"store": KIND}


@app.get("/lag")
async def lag(reset: int = 0) -> dict[str, Any]:
    samples = sorted(LAGS)
    if reset:
        LAGS.clear()
    if not samples:
        return {"samples": 0}
    return {
        "samples": len(samples),
        "p50_ms": round(statistics.median(samples) * 1e3, 3),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3, 3),
        "max_ms": round(samples[-1] * 1e3, 3),
    }


app.add_middleware(
    ASGIIdempotencyMiddleware, handler=HANDLER, get_tenant=lambda request: "bench",
    routes=[("POST", "/charge")],
)
