"""The Celery app chaos worker subprocesses run (``celery -A tests.chaos.celery_app worker``).

Both ledger profiles are tasks of one app on one queue: ``chaos.tx`` (``transactional=True``)
and ``chaos.plain``.  Defaults of the integration are kept (``acks_late``,
``reject_on_worker_lost``); retries are made short so a run stays within its budget, and the
prefetch count is not reduced after a reconnect (unsafe with the threads pool).  The
broker is RabbitMQ (with publisher confirms) or Redis (a short ``visibility_timeout`` and a
1 s unacked-restore sweep), from the transport options the harness passes.  Every delivery
is logged (``chaos_delivery``), and so is every retry published (``chaos_retry``) and every
SUCCESS stored (``chaos_success``), so that the harness can count redeliveries and tell a
message that never arrived from one that was processed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Celery, signals

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
    broker_transport_options=cfg.broker_options,
    # The threads pool: after a reconnect Celery would restore the reduced prefetch count
    # from the threads that ack, with a basic.qos that reads the consumer connection while
    # the main thread reads it too; the stream desynchronises and the worker sits on its
    # prefetched messages (docs/celery.md, risk ``prefetch_reduction_with_threads_pool``).
    worker_enable_prefetch_count_reduction=False,
)
LOG = logging.getLogger("chaos")


@signals.task_prerun.connect
def log_delivery(task_id: str = "", task: Any = None, args: Any = (), **_: Any) -> None:
    redelivered = bool((getattr(task.request, "delivery_info", None) or {}).get("redelivered"))
    LOG.warning("chaos_delivery task_id=%s key=%s redelivered=%s at=%.3f", task_id,
                args[0] if args else "?", redelivered, time.time())


@signals.task_retry.connect
def log_retry(request: Any = None, **_: Any) -> None:
    """Sent once ``Task.retry`` has published the retry message (a new broker message)."""
    LOG.warning("chaos_retry task_id=%s at=%.3f", getattr(request, "id", "?"), time.time())


@signals.task_success.connect
def log_success(sender: Any = None, **_: Any) -> None:
    """Sent once the task's SUCCESS is stored in the result backend."""
    LOG.warning("chaos_success task_id=%s at=%.3f", getattr(sender.request, "id", "?"),
                time.time())


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
