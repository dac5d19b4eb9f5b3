"""Batch claims: ``store.create_many`` in scopes per second, per store and batch size.

Each round claims ``batches`` fresh batches; the single-claim rate (``store.create``, one
round trip each) is measured in the same rounds, alternating, for the speed-up.  Every claim
draws its fencing token inside the store's own statement or script (a PostgreSQL sequence, a
SQLite counter row, a per-shard Redis counter key), as on the hot path.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import ClaimRequest

from .core import open_store

HASH = "a" * 64
SIZES = (100, 500)


def _many_rate(store: Any, size: int, batches: int) -> float:
    tag = uuid.uuid4().hex[:8]
    now = time.time()
    claims = [
        [ClaimRequest(Scope("acme", "orders", f"{tag}-{b}-{i}"), HASH) for i in range(size)]
        for b in range(batches)
    ]
    start = time.perf_counter()
    for batch in claims:
        results = store.create_many(batch, now=now, lease_expires_at=now + 300)
        assert results[0].created
    return batches * size / (time.perf_counter() - start)


def _single_rate(store: Any, count: int) -> float:
    tag = uuid.uuid4().hex[:8]
    now = time.time()
    scopes = [Scope("acme", "orders", f"{tag}-{i}") for i in range(count)]
    start = time.perf_counter()
    for scope in scopes:
        store.create(scope, request_hash=HASH, now=now, lease_expires_at=now + 300)
    return count / (time.perf_counter() - start)


def measure(kind: str, scopes_per_round: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, open_store(kind, Path(tmp)) as store:
        _many_rate(store, 100, 2)  # warm-up: connections, scripts, prepared statements
        samples: dict[str, list[float]] = {"single create": []}
        samples.update({f"create_many({s})": [] for s in SIZES})
        for _ in range(rounds):
            samples["single create"].append(_single_rate(store, max(scopes_per_round // 10, 50)))
            for size in SIZES:
                batches = max(scopes_per_round // size, 2)
                samples[f"create_many({size})"].append(_many_rate(store, size, batches))
        medians = {k: round(statistics.median(v)) for k, v in samples.items()}
        return {"scopes_per_s": medians,
                "speedup": {k: round(v / medians["single create"], 1)
                            for k, v in medians.items() if k != "single create"}}


def run(scopes_per_round: int, rounds: int, kinds: list[str]) -> dict[str, Any]:
    from ._services import retry_once

    return {kind: retry_once(f"batch/{kind}", lambda k=kind: measure(k, scopes_per_round, rounds))
            for kind in kinds}
