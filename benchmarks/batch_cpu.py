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

import json
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


def _batches(store: Any, size: int, tag: str) -> list[Any]:
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
        batches = _batches(store, size, uuid.uuid4().hex[:6])
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


def postgres_server(size: int = 100) -> dict[str, Any]:
    """Execution time (ms, median of ``ROUNDS``) of the two batch statements, each under
    ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back."""
    from idempotent_tasks.stores.sql._statements import scope_arrays

    from .core import open_store

    times: dict[str, list[float]] = {"create_many": [], "mark_success_many": []}
    with open_store("postgresql", None) as store:  # type: ignore[arg-type]
        sql = store._plans.sql
        raw = store.engine.raw_connection()
        try:
            cur = raw.cursor()
            for batch in _batches(store, size, uuid.uuid4().hex[:6]):
                p = scope_arrays([c.scope for c in batch])
                p.update(hashes=[c.request_hash for c in batch], now=time.time(),
                         lease=time.time() + 300)
                times["create_many"].append(_explain(cur, sql.create_many, p))
                cur.execute(sql.create_many, p)  # the claimed rows, read back (explain wrote them)
                tokens = [int(row[6]) for row in cur.fetchall()]
                p.update(tokens=tokens, responses=[b"{}"] * size, expires=[p["now"]] * size)
                times["mark_success_many"].append(_explain(cur, sql.mark_success_many, p))
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
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1:] or ["redis", "postgresql"]), indent=2))
