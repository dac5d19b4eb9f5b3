"""The peers, interleaved with ``execute()`` on the same Redis in the same run: AWS
Powertools' idempotency utility (Redis persistence layer, with and without its local cache)
and celery-once's queue-time lock.

Installed only with the ``bench`` extra.  Each peer does the same job as the row of ours it
is paired with: a first call (claim + store the result), a duplicate call (replay), a
duplicate served by a local in-process cache.  celery-once has no result to replay: its row
is the lock alone, paired with our first delivery (which also stores the result).
"""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._services import REDIS_URL
from ._timing import Op, interleave
from .core import open_store, ours_ops


@contextmanager
def powertools_ops() -> Iterator[dict[str, Op]]:
    os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")
    # Outside Lambda it warns on every call that it cannot read the remaining time.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    client: Any = redis.Redis.from_url(REDIS_URL)
    run_id = uuid.uuid4().hex[:8]

    def make(local: bool) -> Callable[..., Any]:
        layer = RedisCachePersistenceLayer(client=client)
        config = IdempotencyConfig(use_local_cache=local, expires_after_seconds=3600)

        @idempotent_function(
            data_keyword_argument="order", persistence_store=layer, config=config,
            key_prefix=f"ptbench:{run_id}:{int(local)}",
        )
        def charge(order: dict[str, Any]) -> dict[str, bool]:
            return {"ok": True}

        charge(order={"run": run_id, "id": -1})
        return charge

    plain, cached = make(False), make(True)
    try:
        yield {
            "first delivery": lambda i: plain(order={"run": run_id, "id": i}),
            "replay (store)": lambda _: plain(order={"run": run_id, "id": -1}),
            "replay (local cache)": lambda _: cached(order={"run": run_id, "id": -1}),
        }
    finally:
        for key in client.scan_iter(f"ptbench:{run_id}:*", count=1000):
            client.delete(key)
        client.close()


@contextmanager
def celery_once_ops() -> Iterator[dict[str, Op]]:
    from celery_once.backends import Redis as OnceRedis

    backend = OnceRedis({"url": REDIS_URL, "default_timeout": 3600})
    run_id = uuid.uuid4().hex[:8]

    def lock(i: int) -> None:
        backend.raise_or_lock(f"qo_bench_{run_id}_{i}", timeout=3600)

    try:
        yield {"lock (first delivery)": lock}
    finally:
        for key in backend.redis.scan_iter(f"qo_bench_{run_id}_*", count=1000):
            backend.redis.delete(key)


def run(n: int) -> dict[str, Any]:
    """Rows: peer, measure, peer µs, ours µs, ours/peer (paired median)."""
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, open_store("redis", Path(tmp)) as store:
        ours = ours_ops(store)
        for peer, opener in (("powertools (redis)", powertools_ops),
                             ("celery-once (redis)", celery_once_ops)):
            try:
                with opener() as theirs:
                    rows[peer] = {m: _pair(fn, ours[_ours_for(m)], n) for m, fn in theirs.items()}
            except ImportError as exc:
                rows[peer] = {"error": f"not installed ({exc.name}); pip install -e '.[bench]'"}
    return rows


def _ours_for(measure: str) -> str:
    return "first delivery" if measure.startswith("lock") else measure


def _pair(theirs: Op, ours: Op, n: int) -> dict[str, float]:
    result = interleave({"peer": theirs, "ours": ours}, n)
    return {
        "peer": round(result.median("peer"), 2),
        "ours": round(result.median("ours"), 2),
        "ratio": round(result.ratio("ours", "peer"), 3),
    }
