"""Scaling notes, measured (``--only scaling``): table size, index use, concurrency, cleanup.

* Table size (PostgreSQL): one records table per size (10⁴ … 10⁶ by default, 10⁷ with
  ``--scaling-max 10000000``), filled server-side with ``generate_series`` (1% PROCESSING —
  half of them with an expired lease —, 10% expired SUCCESS, the rest live SUCCESS; retry
  counters for 1% of the size, half of them stale orphans), then ``VACUUM ANALYZE``.
  ``execute()`` first delivery and replay run on every table *interleaved in the same
  batches*, so the growth with size is a ratio free of the machine's drift.
* Index use: ``EXPLAIN (ANALYZE, BUFFERS)`` at the largest size of the claim statement (on an
  existing and on a new key), ``find_stuck``, and the two cleanup statements; each runs in a
  transaction that is rolled back.
* Concurrency: first deliveries on distinct keys from 1 → 8 threads (one shared handler and
  store, as in a threaded worker) and 1 → 4 processes (a store each), for a fixed time;
  throughput, speed-up over one worker and per-call latency percentiles.
* Cleanup: ``handler.cleanup_expired_records(limit=…)`` in a loop over ``n`` expired
  records, reported per 10⁵ records.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyHandler, StoreUnavailableError

from ._fill import fill
from ._services import NOISE, retry_on_connection_loss, wait_for_services
from ._timing import interleave
from .core import PAYLOAD, _body, make_handler, open_store

_GENERATE = """
INSERT INTO {t} (tenant, operation, key, status, request_hash, response, fencing_token,
                 created_at, updated_at, lease_expires_at, expires_at)
SELECT 'acme', 'payments.charge', md5(i::text) || '-' || i,
       CASE WHEN i %% 100 = 0 THEN 'PROCESSING' ELSE 'SUCCESS' END,
       repeat('b', 64),
       CASE WHEN i %% 100 = 0 THEN NULL ELSE '{{"charged":true,"amount":100}}'::bytea END,
       7, %(now)s - 1000, %(now)s - 1000,
       CASE WHEN i %% 100 = 0 THEN %(now)s + (i %% 200) * 3 - 300 END,
       CASE WHEN i %% 100 = 0 THEN NULL WHEN i %% 10 = 0 THEN %(now)s - 10
            ELSE %(now)s + 86400 END
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
"""
#: Rows per INSERT: a restart of the shared server (other sessions do that) loses one chunk,
#: which is then inserted again, not the whole table.
GENERATE_CHUNK = 500_000
#: Retry counters for 1% of the scopes; half of them stale and orphaned (cleanup's work).
_GENERATE_COUNTERS = """
INSERT INTO {c} (tenant, operation, key, count, updated_at)
SELECT 'acme', 'payments.charge', 'gone-' || i, 1,
       CASE WHEN i %% 2 = 0 THEN %(now)s - 200000 ELSE %(now)s END
FROM generate_series(1::bigint, %(n)s::bigint / 100) AS i
"""


# --------------------------------------------------------------------------- table size
def _autocommit(store: Any, sql: str, params: dict[str, Any] | None = None) -> None:
    """One statement in its own connection, run again (up to 3 times) after a lost
    connection: every statement given here is atomic, so a retry starts clean."""
    def run() -> None:
        with store.engine.connect() as raw:
            raw.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(sql, params)

    retry_on_connection_loss(f"scaling: {sql.split(maxsplit=1)[0]}", run, attempts=3)


def _generate(store: Any, n: int, now: float) -> None:
    table = f"{store.table_prefix}_records"
    counters = f"{store.table_prefix}_retry_counters"
    for lo in range(1, n + 1, GENERATE_CHUNK):
        hi = min(lo + GENERATE_CHUNK - 1, n)
        _autocommit(store, _GENERATE.format(t=table), {"now": now, "lo": lo, "hi": hi})
    _autocommit(store, _GENERATE_COUNTERS.format(c=counters), {"now": now, "n": n})
    # the generated rows carry token 7: move the store's fencing sequence past it, as
    # create_schema() does for rows that exist before the sequence
    sequence = store.engine.dialect.identifier_preparer.quote(
        f"{store.table_prefix}_fencing_seq")
    _autocommit(store, f"SELECT setval('{sequence}', 7)")
    _autocommit(store, f"VACUUM ANALYZE {table}")
    _autocommit(store, f"VACUUM ANALYZE {counters}")


def table_size(sizes: list[int], n_ops: int) -> dict[str, Any]:
    """execute() first delivery / replay on tables of each size, interleaved."""
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stores = {}
        fill_s: dict[int, float] = {}
        for size in sizes:
            store = stack.enter_context(open_store("postgresql", Path(tmp)))
            t0 = time.perf_counter()
            _generate(store, size, now)
            fill_s[size] = round(time.perf_counter() - t0, 1)
            stores[size] = store
        ops = {}
        for size, store in stores.items():
            h = make_handler(store)
            tag = uuid.uuid4().hex[:6]
            h.execute(_body, operation="bench", tenant="t", key=f"{tag}-done", payload=PAYLOAD)
            ops[f"first@{size}"] = _first_op(h, tag)
            ops[f"replay@{size}"] = _replay_op(h, f"{tag}-done")
        result = interleave(ops, n_ops)
        smallest = sizes[0]
        rows = {
            size: {
                "fill_s": fill_s[size],
                "first_us": round(result.median(f"first@{size}"), 1),
                "replay_us": round(result.median(f"replay@{size}"), 1),
                "first_vs_smallest": round(result.ratio(f"first@{size}", f"first@{smallest}"), 3),
                "replay_vs_smallest": round(
                    result.ratio(f"replay@{size}", f"replay@{smallest}"), 3),
            }
            for size in sizes
        }
        plans = explain(stores[sizes[-1]], now)
        return {"sizes": rows, "explain_at": sizes[-1], "explain": plans}


def _resilient(fn: Callable[[int], None]) -> Callable[[int], None]:
    """``fn(i)``, run once more after the server came back from a restart (that batch's
    time is then an outlier; the medians absorb it, and the note says so)."""

    def op(i: int) -> None:
        try:
            fn(i)
        except StoreUnavailableError as exc:
            NOISE.append(f"scaling: one operation retried after {exc.code.value}")
            wait_for_services()
            fn(i + 50_000_000)  # a fresh key: the lost one may have been claimed

    return op


def _first_op(h: IdempotencyHandler, tag: str) -> Any:
    def first(i: int) -> None:
        h.execute(_body, operation="bench", tenant="t", key=f"{tag}-{i}", payload=PAYLOAD)

    return _resilient(first)


def _replay_op(h: IdempotencyHandler, key: str) -> Any:
    def replay(_: int) -> None:
        h.execute(_body, operation="bench", tenant="t", key=key, payload=PAYLOAD)

    return _resilient(replay)


# --------------------------------------------------------------------------- EXPLAIN
def explain(store: Any, now: float) -> dict[str, list[str]]:
    """Plans (EXPLAIN ANALYZE, rolled back) of the claim and maintenance statements."""
    import psycopg

    from ._services import POSTGRES_DSN

    claim = {"tenant": "acme", "operation": "payments.charge", "key": "c4ca4238a0b923820dcc509a6"
             "f75849b-1", "request_hash": "b" * 64, "now": now, "lease": now + 300}
    statements = {
        "claim (existing key: replay)": (store._plans.sql.claim, claim),
        "claim (new key: first delivery)": (store._plans.sql.claim, {**claim, "key": "new-key"}),
        "find_stuck": (store._common.find_stuck, {"now": now, "limit": 100}),
        "delete_expired (records)": (store._plans.sql.delete_records, {"now": now, "limit": 500}),
        "delete_expired (counters)": (
            store._plans.sql.delete_counters, {"before": now - 86400, "limit": 500}
        ),
    }
    plans: dict[str, list[str]] = {}
    with psycopg.connect(POSTGRES_DSN) as conn:
        for name, (sql, params) in statements.items():
            rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params).fetchall()
            plans[name] = [r[0] for r in rows]
            conn.rollback()
    return plans


def plan_excerpt(lines: list[str]) -> list[str]:
    """The lines that show how rows are found, and the time."""
    words = ("Scan", "Index Cond", "Execution Time", "Conflict", "Limit", "Sort")
    return [line for line in lines if any(w in line for w in words)]


# --------------------------------------------------------------------------- concurrency
def _worker_loop(h: IdempotencyHandler, tag: str, until: float) -> list[float]:
    latencies = []
    i = 0
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        h.execute(_body, operation="bench", tenant="t", key=f"{tag}-{i}", payload=PAYLOAD)
        latencies.append(time.perf_counter() - t0)
        i += 1
    return latencies


def _summary(latencies: list[float], seconds: float) -> dict[str, float]:
    lat = sorted(latencies)
    return {
        "ops_per_s": round(len(lat) / seconds),
        "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
        "p95_us": round(lat[int(len(lat) * 0.95)] * 1e6, 1),
    }


def threads_run(store: Any, count: int, seconds: float) -> dict[str, float]:
    h = make_handler(store)
    results: list[list[float]] = [[] for _ in range(count)]
    until = time.perf_counter() + seconds
    tag = uuid.uuid4().hex[:6]

    def work(slot: int) -> None:
        results[slot] = _worker_loop(h, f"{tag}-{slot}", until)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return _summary([x for r in results for x in r], seconds)


def _child(kind: str, prefix: str, path: str, start_at: float, seconds: float, out: Any) -> None:
    from idempotent_tasks import RedisStore, SQLStore

    from ._services import POSTGRES_URL, REDIS_URL

    if kind == "postgresql":
        store: Any = SQLStore(POSTGRES_URL, table_prefix=prefix)
    elif kind == "sqlite":
        store = SQLStore(f"sqlite:///{path}")
    else:
        store = RedisStore(REDIS_URL, prefix=prefix)
    h = make_handler(store)
    h.execute(_body, operation="bench", tenant="t", key=f"warm-{uuid.uuid4().hex}",
              payload=PAYLOAD)
    time.sleep(max(0.0, start_at - time.time()))
    out.put(_worker_loop(h, uuid.uuid4().hex[:8], time.perf_counter() + seconds))
    store.close()


def processes_run(kind: str, store: Any, count: int, seconds: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    prefix = getattr(store, "table_prefix", None) or getattr(store, "prefix", "")
    path = str(getattr(getattr(store, "engine", None), "url", "")).replace("sqlite:///", "")
    start_at = time.time() + 3.0  # every child imported and warmed up by then
    procs = [ctx.Process(target=_child, args=(kind, prefix, path, start_at, seconds, out))
             for _ in range(count)]
    for p in procs:
        p.start()
    latencies = [x for _ in procs for x in out.get(timeout=120)]
    for p in procs:
        p.join(30)
    return _summary(latencies, seconds)


def concurrency(kinds: list[str], seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            with open_store(kind, Path(tmp)) as store:
                rows: dict[str, Any] = {}
                for n in (1, 2, 4, 8):
                    rows[f"{n} threads"] = threads_run(store, n, seconds)
                for n in (1, 2, 4):
                    rows[f"{n} processes"] = processes_run(kind, store, n, seconds)
                base_t, base_p = rows["1 threads"]["ops_per_s"], rows["1 processes"]["ops_per_s"]
                for name, row in rows.items():
                    base = base_t if "thread" in name else base_p
                    row["speedup"] = round(row["ops_per_s"] / base, 2)
                out[kind] = rows
    return out


# --------------------------------------------------------------------------- cleanup
@contextlib.contextmanager
def _expired_store(kind: str, n: int, workdir: Path) -> Iterator[Any]:
    with open_store(kind, workdir) as store:
        now = time.time()
        fill(store, kind, n, now=now - 1000, expires_at=now - 100)
        yield store


def cleanup(kinds: list[str], n: int, limits: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            rows = {}
            for limit in limits:
                with _expired_store(kind, n, Path(tmp)) as store:
                    h = IdempotencyHandler(store, metrics=None)
                    t0 = time.perf_counter()
                    purged = calls = 0
                    while (done := h.cleanup_expired_records(limit=limit)) > 0:
                        purged += done
                        calls += 1
                    elapsed = time.perf_counter() - t0
                    rows[f"limit={limit}"] = {
                        "records": n, "purged": purged, "calls": calls + 1,
                        "s_per_1e5": round(elapsed * 1e5 / n, 2),
                        "records_per_s": round(purged / elapsed),
                    }
            out[kind] = rows
    return out


def run(sizes: list[int], n_ops: int, seconds: float, cleanup_n: int,
        kinds: list[str]) -> dict[str, Any]:
    from ._services import retry_once

    return {
        "table_size": retry_once("scaling/table_size", lambda: table_size(sizes, n_ops)),
        "concurrency": retry_once("scaling/concurrency", lambda: concurrency(kinds, seconds)),
        "cleanup": retry_once("scaling/cleanup", lambda: cleanup(kinds, cleanup_n, (500, 5000))),
    }


def median(values: list[float]) -> float:
    return statistics.median(values)
