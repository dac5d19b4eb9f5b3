"""``execute()`` against each store, interleaved with the raw floor in the same run.

For every store: first delivery (claim + trivial body + complete), replay from the store
(a DUPLICATE of a SUCCESS record, read in the claim's own round trip), replay from a local
``MemoryCache`` (no store round trip), and the in-progress rejection (a DUPLICATE of a
PROCESSING record with a live lease).  Floor and ours alternate in batches of 25; the ratio
is the median of the paired per-batch ratios.  PostgreSQL and Redis are also interleaved with
their *minimal* floor (``floors.floor_ops(..., minimal=True)``: a bare table / the plain client).
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryCache,
    MemoryStore,
    PrometheusMetrics,
)
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import simulate_crash

from ._services import POSTGRES_URL, REDIS_URL, drop_store
from ._timing import Op, interleave
from .floors import floor_ops

STORES = ["memory", "sqlite", "postgresql", "redis"]
PAYLOAD = {"amount": 100}


@contextlib.contextmanager
def open_store(kind: str, workdir: Path, prefix: str | None = None) -> Iterator[Any]:
    """A fresh store of ``kind`` with a unique table prefix / key prefix, dropped after."""
    store: Any
    tag = prefix or f"bench_{uuid.uuid4().hex[:8]}"
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        from idempotent_tasks import SQLStore

        store = SQLStore(f"sqlite:///{workdir / f'{tag}.db'}")
    elif kind == "postgresql":
        from idempotent_tasks import SQLStore

        store = SQLStore(POSTGRES_URL, table_prefix=tag)
    elif kind == "redis":
        from idempotent_tasks import RedisStore

        tag = tag.replace("_", ":")
        store = RedisStore(REDIS_URL, prefix=tag)
    else:
        raise ValueError(kind)
    try:
        store.create_schema()
        yield store
    finally:
        drop_store(store, kind, tag)


def make_handler(store: Store, cache: Any = None) -> IdempotencyHandler:
    """The handler as a user would build it: Prometheus metrics on, default logger."""
    from prometheus_client import CollectorRegistry

    return IdempotencyHandler(store, cache, metrics=PrometheusMetrics(CollectorRegistry()))


def _body() -> dict[str, bool]:
    return {"ok": True}


def ours_ops(store: Store) -> dict[str, Op]:
    """first delivery, replay (store), replay (local cache), in-progress rejection."""
    h = make_handler(store)
    tag = uuid.uuid4().hex[:6]

    def first(i: int) -> None:
        h.execute(_body, operation="bench", tenant="t", key=f"{tag}-{i}", payload=PAYLOAD)

    h.execute(_body, operation="bench", tenant="t", key=f"{tag}-done", payload=PAYLOAD)

    def replay(_: int) -> None:
        h.execute(_body, operation="bench", tenant="t", key=f"{tag}-done", payload=PAYLOAD)

    cached = make_handler(store, MemoryCache())
    cached.execute(_body, operation="bench", tenant="t", key=f"{tag}-done", payload=PAYLOAD)

    def replay_cached(_: int) -> None:
        cached.execute(_body, operation="bench", tenant="t", key=f"{tag}-done", payload=PAYLOAD)

    # a scope left PROCESSING with a live lease (the default 300 s), as a crashed worker
    # leaves it: every later delivery is refused while the lease lasts
    busy = simulate_crash(h, operation="bench", tenant="t", key=f"{tag}-busy", payload=PAYLOAD)
    assert isinstance(busy, int), busy

    def in_progress(_: int) -> None:
        try:
            h.execute(_body, operation="bench", tenant="t", key=f"{tag}-busy", payload=PAYLOAD)
        except IdempotencyError as exc:
            assert exc.code == ErrorCode.REQUEST_IN_PROGRESS
        else:
            raise AssertionError("a live PROCESSING record must be refused")

    return {
        "first delivery": first,
        "replay (store)": replay,
        "replay (local cache)": replay_cached,
        "in-progress rejection": in_progress,
    }


def measure_kind(kind: str, n: int) -> dict[str, Any]:
    """Ours, the floor and the minimal floor for one store, interleaved; medians and paired
    ratios."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_store(kind, Path(tmp)) as store,
        floor_ops(kind, Path(tmp), POSTGRES_URL, REDIS_URL) as floor,
        floor_ops(kind, Path(tmp), POSTGRES_URL, REDIS_URL, minimal=True) as minimal,
    ):
        ours = ours_ops(store)
        rows: dict[str, Any] = {}
        first_ops = {"ours": ours["first delivery"]}
        dup_ops = {"ours": ours["replay (store)"], "in-progress": ours["in-progress rejection"]}
        for name, ops in (("floor", floor), ("minimal", minimal)):
            if ops:
                first_ops[name] = ops["claim+complete"]
                dup_ops[name] = ops["claim-or-get"]
        first = interleave(first_ops, n)
        dup = interleave(dup_ops, n)
        rows["first delivery"] = _row(first, "claim+complete")
        rows["replay (store)"] = _row(dup, "claim-or-get")
        rows["in-progress rejection"] = _row(dup, "claim-or-get", "in-progress")
        cached = interleave({"ours": ours["replay (local cache)"]}, n)
        rows["replay (local cache)"] = {"ours": cached.median("ours")}
        return rows


def _row(result: Any, floor_name: str, ours: str = "ours") -> dict[str, Any]:
    """``ours``' median, and beside it each floor measured in ``result`` with the paired
    ratio to it (``floor``/``ratio``; ``minimal``/``ratio_minimal``)."""
    row: dict[str, Any] = {"ours": round(result.median(ours), 2)}
    if "floor" in result.samples:
        row.update(floor=round(result.median("floor"), 2), floor_name=floor_name,
                   ratio=round(result.ratio(ours, "floor"), 3))
    if "minimal" in result.samples:
        row.update(minimal=round(result.median("minimal"), 2),
                   ratio_minimal=round(result.ratio(ours, "minimal"), 3))
    return row


def run(stores: list[str], n: int) -> dict[str, Any]:
    from ._services import retry_once

    return {kind: retry_once(f"core/{kind}", lambda k=kind: measure_kind(k, n)) for kind in stores}
