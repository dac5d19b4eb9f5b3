"""The Celery app chaos worker subprocesses run (``celery -A tests.chaos.celery_app worker``).

Both ledger profiles are tasks of one app on one queue: ``chaos.tx`` (``transactional=True``)
and ``chaos.plain``.  Defaults of the integration are kept (``acks_late``,
``reject_on_worker_lost``); retries are made short so a run stays within its budget.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from idempotent_tasks.celery import IdempotentTask, setup

from ._body import OPERATIONS, LedgerWriter, WorkerConfig, make_handler

cfg = WorkerConfig.from_env()
app = Celery("chaos", broker=cfg.broker_url, backend=cfg.result_url)
app.conf.update(
    task_default_queue=cfg.queue,
    worker_prefetch_multiplier=2,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    result_expires=3600,
    worker_hijack_root_logger=False,
    worker_enable_remote_control=False,
)
handler = make_handler(cfg)
setup(app, handler, beat=False, maintenance="worker", recover_every=2.0)
ledger = LedgerWriter(cfg)
FAST: dict[str, Any] = {"wait_backoff": (0.2, 1.0), "default_retry_delay": 0.2, "shared": False}


@app.task(base=IdempotentTask, name=OPERATIONS["transactional"], transactional=True, **FAST)
def chaos_tx(key: str, conn: Any = None) -> dict[str, str]:
    return ledger.transactional(conn, key)


@app.task(base=IdempotentTask, name=OPERATIONS["plain"], **FAST)
def chaos_plain(key: str) -> dict[str, str]:
    return ledger.plain(key)
