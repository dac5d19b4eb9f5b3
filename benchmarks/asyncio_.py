"""Native asyncio (``--only asyncio``): the async stores against their async floors, and an
ASGI server on the native path against the same server on the thread-hop path.

* Floors, in the same event loop and run as the library, interleaved in batches:
  ``redis.asyncio`` — one EVALSHA claim-or-get (``SET NX`` or ``GET``) + one ``SET XX``
  (claim + complete), and the claim-or-get alone (replay); psycopg async — autocommit
  ``INSERT … ON CONFLICT DO NOTHING RETURNING`` + a conditional ``UPDATE`` on a table made by
  ``AsyncSQLStore.create_schema``, and the one-statement claim-or-get on an existing key.
  Ours: ``await handler.execute_async(...)`` on ``AsyncRedisStore`` / ``AsyncSQLStore``
  (first delivery: a fresh key each; replay: one key that succeeded), Prometheus metrics on.
* HTTP: a uvicorn process (1 worker, ``--loop asyncio``) serving ``benchmarks._asgi_app``
  (a trivial FastAPI endpoint behind ``ASGIIdempotencyMiddleware``), loaded by
  ``benchmarks._load`` in a separate process with 200 concurrent keep-alive clients on
  loopback, every request a first delivery.  For each store family the native async store
  and the sync store (the thread-hop path, on the handler's executor of 16 threads, and on 6
  threads: the size of the loop's default pool that ``asyncio.to_thread`` used before) run
  alternately; requests/s, the server process's CPU per request (and its ratio native /
  16-thread hop, from the same run), latency p50/p99 and the server's event-loop lag p99
  while loaded.
  Saturating load keeps the one loop 100 % busy, so its lag there is the time to serve the
  queue, whatever the store; the same clients paced at half that rate show the lag that a
  blocking call would add (the lag target is read there).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ._services import OPENED, POSTGRES_URL, REDIS_URL
from ._timing import Interleaved

ROOT = Path(__file__).resolve().parent.parent
AOp = Callable[[int], Awaitable[None]]
PAYLOAD = {"amount": 100, "currency": "EUR"}
_HASH = "a" * 64
_REDIS_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""


async def ainterleave(ops: Mapping[str, AOp], n: int, batch: int = 25,
                      warmup: int = 50) -> Interleaved:
    """``_timing.interleave`` for coroutines: alternating batches of every op, the garbage
    collector paused during a batch."""
    result = Interleaved({name: [] for name in ops})
    for fn in ops.values():
        for i in range(-warmup, 0):
            await fn(i - 10_000_000)
    gc_was_enabled = gc.isenabled()
    try:
        for start in range(0, max(n, batch), batch):
            gc.collect()
            gc.disable()  # as timeit and _timing.interleave do
            for name, fn in ops.items():
                t0 = time.perf_counter()
                for i in range(start, start + batch):
                    await fn(i)
                result.samples[name].append((time.perf_counter() - t0) / batch * 1e6)
            if gc_was_enabled:
                gc.enable()
    finally:
        if gc_was_enabled:
            gc.enable()
    return result


# --------------------------------------------------------------------------- floors
@contextlib.asynccontextmanager
async def redis_floor() -> AsyncIterator[dict[str, AOp]]:
    import redis.asyncio

    client: Any = redis.asyncio.Redis.from_url(REDIS_URL)
    script = client.register_script(_REDIS_CLAIM)
    prefix = f"afloor:{uuid.uuid4().hex[:8]}"
    processing = b"PROCESSING|" + _HASH.encode()

    async def first(i: int) -> None:
        key = f"{prefix}:{i}"
        await script(keys=[key], args=[processing, 600_000])
        await client.set(key, b'SUCCESS|{"ok":true}', xx=True, px=600_000)

    async def replay(_: int) -> None:
        await script(keys=[f"{prefix}:done"], args=[processing, 600_000])

    await client.set(f"{prefix}:done", b'SUCCESS|{"ok":true}', px=600_000)
    try:
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        async for key in client.scan_iter(f"{prefix}:*", count=1000):
            await client.delete(key)
        await client.aclose()


@contextlib.asynccontextmanager
async def pg_floor(table: str) -> AsyncIterator[dict[str, AOp]]:
    import psycopg

    from .floors import _CLAIM_OR_GET, _INSERT, _RESPONSE, _UPDATE

    dsn = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    insert, update = _INSERT.format(t=table, p="%s"), _UPDATE.format(t=table, p="%s")
    claim_or_get = _CLAIM_OR_GET.format(t=table)
    tag = f"floor-{uuid.uuid4().hex[:6]}"

    async def first(i: int) -> None:
        key = f"{tag}-{i}"
        await (await conn.execute(insert, ("t", "op", key, _HASH, 7, 1.0, 1.0, 2.0))).fetchone()
        await conn.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", key, 7))

    async def replay(_: int) -> None:
        params = ("t", "op", "done", _HASH, 8, 1.0, 1.0, 2.0, "t", "op", "done")
        await (await conn.execute(claim_or_get, params)).fetchone()

    await first(-1)
    await conn.execute(insert, ("t", "op", "done", _HASH, 7, 1.0, 1.0, 2.0))
    await conn.execute(update, (_RESPONSE, 1.0, 9.0, "t", "op", "done", 7))
    try:
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        await conn.close()


# --------------------------------------------------------------------------- ours
def _handler(store: Any) -> Any:
    from prometheus_client import CollectorRegistry

    from idempotent_tasks import IdempotencyHandler, PrometheusMetrics

    return IdempotencyHandler(store, metrics=PrometheusMetrics(CollectorRegistry()))


async def _body() -> dict[str, bool]:
    return {"ok": True}


async def ours_ops(store: Any) -> dict[str, AOp]:
    h = _handler(store)
    tag = uuid.uuid4().hex[:6]

    async def first(i: int) -> None:
        await h.execute_async(_body, operation="bench", tenant="t", key=f"{tag}-{i}",
                              payload=PAYLOAD)

    async def replay(_: int) -> None:
        await h.execute_async(_body, operation="bench", tenant="t", key=f"{tag}-done",
                              payload=PAYLOAD)

    await replay(0)
    return {"first delivery": first, "replay (store)": replay}


async def measure_store(kind: str, n: int) -> dict[str, Any]:
    from idempotent_tasks import AsyncRedisStore, AsyncSQLStore

    prefix = f"abench_{uuid.uuid4().hex[:8]}"
    OPENED.append((kind, prefix))
    store: Any = (
        AsyncSQLStore(POSTGRES_URL, table_prefix=prefix) if kind == "postgresql"
        else AsyncRedisStore(REDIS_URL, prefix=prefix)
    )
    await store.create_schema()
    try:
        floor_cm = pg_floor(f"{prefix}_records") if kind == "postgresql" else redis_floor()
        async with floor_cm as floor:
            ours = await ours_ops(store)
            first = await ainterleave(
                {"floor": floor["claim+complete"], "ours": ours["first delivery"]}, n
            )
            replay = await ainterleave(
                {"floor": floor["claim-or-get"], "ours": ours["replay (store)"]}, n
            )
    finally:
        await store.drop_schema()
        await store.close()
    return {"first delivery": _row(first, "claim+complete"),
            "replay (store)": _row(replay, "claim-or-get")}


def _row(result: Interleaved, floor_name: str) -> dict[str, Any]:
    return {
        "ours": round(result.median("ours"), 2),
        "floor": round(result.median("floor"), 2),
        "floor_name": floor_name,
        "ratio": round(result.ratio("ours", "floor"), 3),
    }


# --------------------------------------------------------------------------- HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


@contextlib.contextmanager
def _server(store: str, threads: int) -> Any:
    family = store.removeprefix("async_")
    prefix = f"hbench_{uuid.uuid4().hex[:8]}"
    OPENED.append((family, prefix))
    port = _free_port()
    env = dict(os.environ, IT_BENCH_STORE=store, IT_BENCH_PREFIX=prefix,
               IT_BENCH_THREADS=str(threads), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "benchmarks._asgi_app:app", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--loop", "asyncio", "--no-access-log",
         "--log-level", "warning"],
        cwd=ROOT, env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(port, "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"uvicorn ({store}) did not start") from None
                time.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(port: int, clients: int, seconds: float, rate: float = 0.0) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._load", str(port), str(clients), str(seconds),
         str(rate)],
        cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120, check=True,
    )
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def http_run(store: str, threads: int, clients: int, seconds: float) -> dict[str, Any]:
    """One server: a short warm-up load, then the measured saturating one, then the same
    clients paced at half the requests/s just measured; the loop's lag under each."""
    with _server(store, threads) as (port, pid):
        _load(port, clients, min(2.0, seconds))
        _get(port, "/lag?reset=1")
        cpu_before = _process_cpu(pid)
        result = _load(port, clients, seconds)
        cpu = _process_cpu(pid) - cpu_before
        # server CPU per request: holds on a 2-core machine where throughput does not
        result["server_cpu_us_per_request"] = (
            round(cpu / result["requests"] * 1e6, 1) if result["requests"] else None
        )
        result["loop_lag"] = _get(port, "/lag?reset=1")
        half = _load(port, clients, seconds, rate=max(result["rps"] / 2, 1.0))
        half["loop_lag"] = _get(port, "/lag?reset=1")
        result["half_load"] = half
    return result


HTTP_VARIANTS = {
    "redis": [("native (AsyncRedisStore)", "async_redis", 16),
              ("thread hop, 16 threads (RedisStore)", "redis", 16),
              ("thread hop, 6 threads (RedisStore)", "redis", 6)],
    "postgresql": [("native (AsyncSQLStore)", "async_postgresql", 16),
                   ("thread hop, 16 threads (SQLStore)", "postgresql", 16),
                   ("thread hop, 6 threads (SQLStore)", "postgresql", 6)],
}


def http_section(clients: int, seconds: float, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": clients, "seconds": seconds, "rounds": rounds}
    for family, variants in HTTP_VARIANTS.items():
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
        for _ in range(rounds):  # alternately: the machine's noise hits them alike
            for label, store, threads in variants:
                runs[label].append(http_run(store, threads, clients, seconds))
        out[family] = {label: _median_run(r) for label, r in runs.items()}
        native, hop = (out[family][variants[i][0]]["rps"] for i in (0, 2))
        out[family]["native / thread hop (6 threads)"] = round(native / hop, 2) if hop else None
        # server CPU per request, both paths of the same run (the handler's 16-thread hop)
        cpu = [out[family][variants[i][0]].get("server_cpu_us_per_request") for i in (0, 1)]
        out[family]["server CPU: native / thread hop (16 threads)"] = (
            round(cpu[0] / cpu[1], 2) if cpu[0] and cpu[1] else None
        )
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
    return {**best, "rps_all": [r["rps"] for r in runs]}


def run(n: int, clients: int, seconds: float, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("redis", "postgresql"):
        out[kind] = asyncio.run(measure_store(kind, n))
    out["http"] = http_section(clients, seconds, rounds)
    return out


# --------------------------------------------------------------------------- report
def table(data: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title="asyncio: async stores vs async floors (µs per op, medians)")
    for col in ("store", "measure", "ours", "floor", "ratio"):
        t.add_column(col)
    for kind in ("redis", "postgresql"):
        for measure, row in (data.get(kind) or {}).items():
            t.add_row(kind, f"{measure} vs {row['floor_name']}", f"{row['ours']:.1f}",
                      f"{row['floor']:.1f}", f"{row['ratio']:.2f}x")
    console.print(t)
    http = data.get("http") or {}
    h = Table(title=f"asyncio: uvicorn + FastAPI + middleware, {http.get('clients')} clients")
    for col in ("store", "path", "req/s", "server CPU µs/req", "p50 ms", "p99 ms",
                "lag p99 ms", "errors", "½ load: req/s", "p50", "p99", "lag p99"):
        h.add_column(col)
    for family in ("redis", "postgresql"):
        for label, r in (http.get(family) or {}).items():
            if isinstance(r, dict):
                half = r.get("half_load") or {}
                h.add_row(
                    family, label, f"{r['rps']:,.0f}",
                    str(r.get("server_cpu_us_per_request", "-")), str(r["p50_ms"]),
                    str(r["p99_ms"]),
                    str(r.get("loop_lag", {}).get("p99_ms", "-")), str(r["errors"]),
                    f"{half.get('rps', 0):,.0f}", str(half.get("p50_ms", "-")),
                    str(half.get("p99_ms", "-")),
                    str(half.get("loop_lag", {}).get("p99_ms", "-")),
                )
    console.print(h)


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    from .report import _check, _get

    rows = [
        _check("async: first delivery vs redis.asyncio floor (claim script + SET XX)",
               _get(report, "asyncio", "redis", "first delivery", "ratio"), 1.3),
        _check("async: first delivery vs psycopg async floor (INSERT…RETURNING + UPDATE)",
               _get(report, "asyncio", "postgresql", "first delivery", "ratio"), 1.3),
        _check("async: replay vs redis.asyncio claim-or-get floor",
               _get(report, "asyncio", "redis", "replay (store)", "ratio"), 1.3),
        _check("async: replay vs psycopg async claim-or-get floor",
               _get(report, "asyncio", "postgresql", "replay (store)", "ratio"), 1.3),
    ]
    for family, native in (("redis", "native (AsyncRedisStore)"),
                           ("postgresql", "native (AsyncSQLStore)")):
        rows.append(_check(
            f"HTTP {family}: native req/s vs thread hop (6 threads, as before)",
            _get(report, "asyncio", "http", family, "native / thread hop (6 threads)"), 2.0,
            at_least=True))
        rows.append(_check(
            f"HTTP {family}: server CPU per request, native / thread hop (16 threads)",
            _get(report, "asyncio", "http", family, "server CPU: native / thread hop (16 threads)"),
            0.6))
        rows.append(_check(
            f"HTTP {family}: event-loop lag p99 at half the saturating load (native)",
            _get(report, "asyncio", "http", family, native, "half_load", "loop_lag", "p99_ms"),
            5.0, "{:.2f} ms"))
    return rows
