"""What one scope of a batch costs, part by part: the client's instructions (callgrind) and
the server's time (Redis ``INFO commandstats``; PostgreSQL ``EXPLAIN (ANALYZE, BUFFERS)``)::

    python -m benchmarks.batch_cpu [KIND ...]          # default: redis postgresql

Client: ``_batch_cpu_probe.py`` under callgrind with ``BATCHES`` batches of two sizes; one
scope = the difference of the two counts over ``BATCHES * ΔSIZE``.  ``claim`` is
``create_many``; ``complete`` is ``both`` minus ``claim`` (``mark_success_many``); ``run_many``
is the handler's batch path with ``batch_completion=True`` (store calls included).

Server, Redis: ``CONFIG RESETSTAT`` (this resets the whole server's statistics), then
``ROUNDS`` batches of 100 claimed and completed; ``usec_per_call`` of ``evalsha`` is one
script call, i.e. one batch of 100 (``claim_many.lua`` and ``mark_success_many.lua`` both run
as EVALSHA, so each is measured alone).  PostgreSQL: each batch statement under
``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back, on a table of its own.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .cpu import ROOT, callgrind_instructions

PROBE = ["-m", "benchmarks._batch_cpu_probe"]
SIZES = (50, 150)
BATCHES = 10
ROUNDS = 30


def client(kind: str, tree: Path = ROOT) -> dict[str, float]:
    """Instructions per scope of ``claim``, ``complete`` and ``run_many`` on ``kind``."""
    counts: dict[tuple[str, int], int] = {}
    for op in ("claim", "both", "run_many"):
        for size in SIZES:
            counts[op, size] = callgrind_instructions(
                tree, [sys.executable, *PROBE, kind, op, str(size), str(BATCHES)],
                f"{kind} {op} {size}", timeout=900,
            )
    per = {op: (counts[op, SIZES[1]] - counts[op, SIZES[0]]) / (BATCHES * (SIZES[1] - SIZES[0]))
           for op in ("claim", "both", "run_many")}
    return {"create_many": round(per["claim"]),
            "mark_success_many": round(per["both"] - per["claim"]),
            "run_many (batch_completion)": round(per["run_many"])}


def _batches(size: int, tag: str) -> list[Any]:
    from idempotent_tasks._core.records import Scope
    from idempotent_tasks.stores.base import ClaimRequest

    return [[ClaimRequest(Scope("acme", "orders", f"{tag}-{b}-{i}"), "a" * 64)
             for i in range(size)] for b in range(ROUNDS)]


def redis_server(size: int = 100) -> dict[str, float]:
    """µs of one ``claim_many.lua`` and one ``mark_success_many.lua`` call of ``size``."""
    import redis

    from idempotent_tasks.stores.base import SuccessWrite

    from .core import open_store

    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    out: dict[str, float] = {}
    with open_store("redis", None) as store:  # type: ignore[arg-type]
        batches = _batches(size, uuid.uuid4().hex[:6])
        now = time.time()
        store.create_many(batches[0][:1], now=now, lease_expires_at=now + 300)  # scripts loaded
        claimed = []
        r.config_resetstat()
        for batch in batches:
            claimed.append(store.create_many(batch, now=now, lease_expires_at=now + 300))
        out["claim_many.lua"] = r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
        r.config_resetstat()
        for batch, results in zip(batches, claimed, strict=True):
            writes = [SuccessWrite(c.scope, res.record.fencing_token, b"{}", now + 86400)
                      for c, res in zip(batch, results, strict=True)]
            store.mark_success_many(writes, now=now)
        out["mark_success_many.lua"] = r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    return {k: round(v, 1) for k, v in out.items()}


def redis_server_instructions(size: int = 100, batches: int = 10) -> dict[str, int]:
    """Server instructions per scope of ``claim_many.lua`` (new scopes) and
    ``mark_success_many.lua``: a private ``redis-server`` on a free port under callgrind,
    its counters zeroed before and dumped after each part (``callgrind_control``), the
    machine's own Redis untouched.  Unlike ``usec_per_call`` this does not move with the
    load of the machine."""
    import socket
    import subprocess
    import tempfile

    import redis

    from idempotent_tasks import RedisStore
    from idempotent_tasks.stores.base import SuccessWrite

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="batch-cpu-redis-"))
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "redis-server",
         "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def counted(part: Any) -> int:
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True,
                       capture_output=True)
        part()
        for old in out.glob("cg.*"):
            old.unlink()
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True,
                       capture_output=True)
        lines = [line for f in out.glob("cg.*") for line in f.read_text().splitlines()]
        return max(int(line.split()[1]) for line in lines
                   if line.startswith(("summary:", "totals:")))

    try:
        ping = redis.Redis(port=port)
        for _ in range(600):  # the server starts slowly under valgrind
            with contextlib.suppress(redis.ConnectionError):
                ping.ping()
                break
            time.sleep(0.1)
        store = RedisStore(f"redis://127.0.0.1:{port}/0", prefix="bcpu")
        now = time.time()
        store.create_many(_batches(1, "warm")[0], now=now, lease_expires_at=now + 300)
        todo = _batches(size, "b")[:batches]
        claimed: list[Any] = []
        claim = counted(lambda: claimed.extend(
            store.create_many(b, now=now, lease_expires_at=now + 300) for b in todo))
        writes = [[SuccessWrite(c.scope, r.record.fencing_token, b"{}", now + 86400)
                   for c, r in zip(b, rs, strict=True)]
                  for b, rs in zip(todo, claimed, strict=True)]
        complete = counted(lambda: [store.mark_success_many(w, now=now) for w in writes])
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(out, ignore_errors=True)
    return {"claim_many.lua, new scopes": claim // (size * batches),
            "mark_success_many.lua": complete // (size * batches)}


def postgres_server(size: int = 100) -> dict[str, Any]:
    """Execution time (ms, median of ``ROUNDS``) of the two batch statements, each under
    ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back; statements and parameters
    are the ones the store's plans yield."""
    from idempotent_tasks.stores.base import SuccessWrite

    from .core import open_store

    times: dict[str, list[float]] = {"create_many": [], "mark_success_many": []}
    with open_store("postgresql", None) as store:  # type: ignore[arg-type]
        plans = store._plans
        raw = store.engine.raw_connection()
        try:
            cur = raw.cursor()
            for batch in _batches(size, uuid.uuid4().hex[:6]):
                now = time.time()
                plan = plans.create_many(batch, now=now, lease_expires_at=now + 300)
                sql, params, _ = next(plan)
                times["create_many"].append(_explain(cur, sql, params))
                cur.execute(sql, params)  # the claimed rows, read back (explain wrote them)
                try:
                    plan.send(cur.fetchall())
                except StopIteration as done:
                    writes = [SuccessWrite(c.scope, r.record.fencing_token, b"{}", now + 86400)
                              for c, r in zip(batch, done.value, strict=True)]
                sql, params, _ = next(plans.mark_success_many(writes, now=now))
                times["mark_success_many"].append(_explain(cur, sql, params))
                raw.rollback()
        finally:
            raw.rollback()
            raw.close()
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def _explain(cur: Any, sql: str, params: dict[str, Any]) -> float:
    cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
    plan = cur.fetchall()[0][0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return float(plan[0]["Execution Time"])


def run(kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": list(SIZES), "batches": BATCHES}
    for kind in kinds:
        out[kind] = {"client instructions per scope": client(kind)}
        server = redis_server() if kind == "redis" else postgres_server()
        out[kind]["server, batch of 100"] = server
        if kind == "redis":
            out[kind]["server instructions per scope"] = redis_server_instructions()
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1:] or ["redis", "postgresql"]), indent=2))
