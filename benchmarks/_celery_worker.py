"""A real ``celery worker --pool=solo`` process for the end-to-end benchmark.

``python -m benchmarks._celery_worker CONFIG_JSON``: builds the app and the task of one
variant (the same definitions as ``e2e._celery_task``), attaches to the store the parent
created (same table / key prefix), times every task with the ``task_prerun`` /
``task_postrun`` signals, and when the ``n``-th task has ended writes ``{"first": …,
"ends": […]}`` (``time.perf_counter()`` of this process) to ``out`` and exits at once.
The parent starts it only after the broker holds all ``n`` messages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def attach_store(kind: str, prefix: str) -> Any:
    """The store the parent created and will drop: no schema work here."""
    from ._services import POSTGRES_URL, REDIS_URL

    if kind == "postgresql":
        from idempotent_tasks import SQLStore

        return SQLStore(POSTGRES_URL, table_prefix=prefix)
    if kind == "redis":
        from idempotent_tasks import RedisStore

        return RedisStore(REDIS_URL, prefix=prefix)
    raise ValueError(f"no worker-process store for {kind!r}")


def main(config: dict[str, Any]) -> None:
    from celery import Celery, signals

    from . import e2e

    n: int = config["n"]
    out = Path(config["out"])
    app = Celery(f"bench_{config['queue']}", broker=config["broker"], set_as_current=False)
    app.conf.update(
        task_default_queue=config["queue"], broker_heartbeat=0, task_ignore_result=True,
        worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
    )
    store: Any = None
    if config["store"] is not None:
        store = attach_store(config["store"]["kind"], config["store"]["prefix"])
        if config["wrapper"] is not None:  # Direct or Floor
            store = getattr(e2e, config["wrapper"])(store)
    task = e2e._celery_task(app, store, config["acks_late"])
    first = 0.0
    ends: list[float] = []

    def started(**_: Any) -> None:
        nonlocal first
        if not first:
            first = time.perf_counter()

    def ended(**_: Any) -> None:
        ends.append(time.perf_counter())
        if len(ends) == n:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"first": first, "ends": ends}))
            tmp.rename(out)
            os._exit(0)  # the parent deletes the queue: nothing left to ack or clean

    signals.task_prerun.connect(started, sender=task, weak=False)
    signals.task_postrun.connect(ended, sender=task, weak=False)
    app.worker_main([
        "worker", "--pool=solo", "--concurrency=1", "--loglevel=CRITICAL",
        f"--queues={config['queue']}", "--without-gossip", "--without-mingle",
        "--without-heartbeat",
    ])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
