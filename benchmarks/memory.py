"""Memory / disk per 1M stored SUCCESS records, per store.

* PostgreSQL: ``pg_total_relation_size`` of the records table (heap + indexes + TOAST) after
  filling it (``_fill.py``), before and after ``VACUUM`` (each record is inserted, then updated
  once, so until autovacuum runs the table also holds the dead pre-update row versions).
* Redis: ``INFO memory`` ``used_memory`` delta on a private ``redis-server`` started here on a
  free port (``--save "" --appendonly no``), so the shared server is never flushed or measured.
* SQLite: file size (after a WAL checkpoint).
* memory: ``tracemalloc`` delta of ``MemoryStore``.

Figures for fewer than 1M records are extrapolated linearly to 1M (reported as such).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotent_tasks import MemoryStore, RedisStore

from ._fill import fill
from .core import open_store

MILLION = 1_000_000


def _per_million(total_bytes: float, n: int) -> dict[str, Any]:
    return {
        "records": n,
        "bytes_per_record": round(total_bytes / n, 1),
        "per_1M_MiB": round(total_bytes / n * MILLION / 2**20, 1),
        "extrapolated": n < MILLION,
    }


def postgresql(n: int) -> dict[str, Any]:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp, open_store("postgresql", Path(tmp)) as store:
        fill(store, "postgresql", n, now=now, expires_at=now + 86400)
        table = f"{store.table_prefix}_records"
        before = _pg_size(store, table)
        with store.engine.connect() as raw:
            raw.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f"VACUUM {table}")
        after = _pg_size(store, table)
        return {"before VACUUM": _per_million(before, n), "after VACUUM": _per_million(after, n)}


def _pg_size(store: Any, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT pg_total_relation_size('{table}')").scalar_one())


def sqlite(n: int) -> dict[str, Any]:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp, open_store("sqlite", Path(tmp)) as store:
        fill(store, "sqlite", n, now=now, expires_at=now + 86400)
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        path = Path(store.engine.url.database or "")
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        return _per_million(size, n)


def memory(n: int) -> dict[str, Any]:
    store = MemoryStore()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    now = time.time()
    fill(store, "memory", n, now=now, expires_at=now + 86400)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return _per_million(used, n)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A throw-away redis-server on a free port; killed (by its pid) afterwards."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def redis(n: int, listpack_value: int | None = None) -> dict[str, Any]:
    """``listpack_value``: ``hash-max-listpack-value`` for the private server (default 64:
    a record whose encoded scope is longer than 64 bytes — tenant + operation + a UUID key
    already is — falls back to the hashtable encoding, about twice the memory)."""
    import redis as redis_py

    with private_redis() as url:
        client: Any = redis_py.Redis.from_url(url)
        if listpack_value is not None:
            client.config_set("hash-max-listpack-value", listpack_value)
        store = RedisStore(url, prefix="mem")
        store.create_schema()
        before = int(client.info("memory")["used_memory"])
        now = time.time()
        fill(store, "redis", n, now=now, expires_at=now + 86400)
        after = int(client.info("memory")["used_memory"])
        keys = int(client.dbsize())
        sample = next(iter(client.scan_iter("mem:*:r", count=100)))
        encoding = client.object("encoding", sample).decode()
        store.close()
        client.close()
    out = _per_million(after - before, n)
    out["keys"] = keys
    out["record_encoding"] = encoding
    return out


def redis_listpack(n: int) -> dict[str, Any]:
    return redis(n, listpack_value=256)


SECTIONS = {"memory": memory, "sqlite": sqlite, "postgresql": postgresql, "redis": redis,
            "redis (hash-max-listpack-value 256)": redis_listpack}


def run(sizes: dict[str, int]) -> dict[str, Any]:
    """``sizes``: records to insert per store kind."""
    from ._services import NOISE, retry_once

    out: dict[str, Any] = {}
    for kind, n in sizes.items():
        try:
            out[kind] = retry_once(f"memory/{kind}", lambda k=kind, n=n: SECTIONS[k](n))
        except Exception as exc:  # keep the other stores' figures
            out[kind] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            NOISE.append(f"memory/{kind}: failed: {out[kind]['error']}")
    return out


if __name__ == "__main__":  # pragma: no cover - manual use
    print(run({"memory": 10_000, "sqlite": 10_000, "redis": 10_000,
               "postgresql": int(os.environ.get("N", "10000"))}))
