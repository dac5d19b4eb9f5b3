"""The Celery app of ``test_config_warnings.py``'s worker subprocesses, on the Redis broker.

``IT_PROFILE`` picks the configuration: ``risky`` (a 10 s lease, no heartbeat, no time limit:
``lease_may_expire_while_running``; and a task of the app with ``acks_late=False``, a risk only
visible once the app is finalized), ``custom_logging`` (the same, with the application
handling logging itself through ``setup_logging``, so Celery sends no ``after_setup_logger``),
or ``safe`` (a heartbeat: nothing to report).  ``IT_BROKER_URL``, ``IT_QUEUE``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery, signals

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.celery import IdempotentTask, idempotent_task, setup

PROFILE = os.environ["IT_PROFILE"]

app = Celery("risky", broker=os.environ["IT_BROKER_URL"])
app.conf.update(task_default_queue=os.environ["IT_QUEUE"], broker_connection_retry_on_startup=True)
handler = IdempotencyHandler(
    MemoryStore(), lease_timeout=10, metrics=None,
    heartbeat_interval=2.5 if PROFILE == "safe" else None,
)
setup(app, handler, beat=False)

if PROFILE == "custom_logging":

    @signals.setup_logging.connect
    def own_logging(**_: Any) -> None:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="APPLOG %(levelname)s %(name)s %(message)s")


@idempotent_task(name="risky.slow")
def slow() -> None:
    return None


if PROFILE != "safe":

    @app.task(base=IdempotentTask, name="risky.early", acks_late=False)  # acks_early_loses_crashed_tasks
    def early() -> None:
        return None
