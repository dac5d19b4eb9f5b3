"""The peers, measured in the same run on the same Redis: AWS Powertools' idempotency
utility (Redis persistence layer, with and without its local cache) and celery-once's lock.

Installed only with the ``bench`` extra.  Each peer is timed doing the same job as our
``execute()`` rows: a first call (claim + store the result) and a duplicate call (replay).
celery-once has no result to replay: its row is the queue-time lock alone.
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Any

from ._timing import per_op_us

REDIS_URL = "redis://127.0.0.1:6379/0"


def powertools(n: int) -> dict[str, float]:
    os.environ.setdefault("POWERTOOLS_IDEMPOTENCY_DISABLED", "false")
    # Outside Lambda it warns on every call that it cannot read the remaining time.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    client: Any = redis.Redis.from_url(REDIS_URL)
    results: dict[str, float] = {}
    for label, local in (("", False), (" (local cache)", True)):
        layer = RedisCachePersistenceLayer(client=client)
        config = IdempotencyConfig(use_local_cache=local, expires_after_seconds=3600)
        run_id = uuid.uuid4().hex[:8]

        @idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
        def charge(order: dict[str, Any]) -> dict[str, bool]:
            return {"ok": True}

        charge(order={"run": run_id, "id": -1})

        def first(i: int, run_id: str = run_id, fn: Any = charge) -> None:
            fn(order={"run": run_id, "id": i})

        def replay(_: int, run_id: str = run_id, fn: Any = charge) -> None:
            fn(order={"run": run_id, "id": -1})

        if not local:
            results["first delivery"] = per_op_us(first, n)
        results["replay" + label] = per_op_us(replay, n)
    client.close()
    return results


def celery_once(n: int) -> dict[str, float]:
    from celery_once.backends import Redis as OnceRedis

    backend = OnceRedis({"url": REDIS_URL, "default_timeout": 3600})
    run_id = uuid.uuid4().hex[:8]

    def lock(i: int) -> None:
        backend.raise_or_lock(f"qo_bench_{run_id}_{i}", timeout=3600)

    try:
        return {"lock (first delivery)": per_op_us(lock, n)}
    finally:
        for key in backend.redis.scan_iter(f"qo_bench_{run_id}_*"):
            backend.redis.delete(key)
