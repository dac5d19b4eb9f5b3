"""The Celery app of the outbox chaos run (``celery -A tests.outbox.chaos_celery_app worker``).

``outbox.charge`` (the first hop, on the charge queue) writes ``hop1`` and stages three
follow-ups through its ``outbox`` argument: ``outbox.capture`` (Celery, the capture queue),
``outbox.ship`` (Dramatiq) and a Kafka record.  ``outbox.capture`` writes ``hop2-celery``.
Both are transactional; the relay (``idempotent-tasks relay --celery-app`` this module's
``app``) publishes the follow-ups with publisher confirms.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from idempotent_tasks.celery import IdempotentTask, setup
from idempotent_tasks.outbox import celery_task, dramatiq_message, kafka_record

from ._chaos_config import CAPTURE, CHARGE, ChaosConfig, make_handler, write

cfg = ChaosConfig.from_env()
app = Celery("outbox-chaos", broker=cfg.broker_url, set_as_current=False)
app.conf.update(
    task_default_queue=cfg.charge_queue, worker_prefetch_multiplier=2,
    broker_connection_retry_on_startup=True, broker_connection_max_retries=None,
    broker_transport_options={"confirm_publish": True}, worker_hijack_root_logger=False,
    worker_enable_remote_control=False, task_ignore_result=True,
)
handler = make_handler(cfg)
setup(app, handler, beat=False, maintenance="worker", recover_every=2.0)
FAST: dict[str, Any] = {"wait_backoff": (0.2, 1.0), "default_retry_delay": 0.2,
                        "shared": False}


@app.task(base=IdempotentTask, name=CHARGE, transactional=True, **FAST)
def charge(order: str, conn: Any = None, outbox: Any = None) -> str:
    token = write(cfg, conn, "hop1", order)
    outbox.send(celery_task(CAPTURE, [order], queue=cfg.capture_queue))
    outbox.send(dramatiq_message("ship", [order], queue_name=cfg.ship_queue))
    outbox.send(kafka_record(cfg.topic, {"order": order}, key=order))
    return token


@app.task(base=IdempotentTask, name=CAPTURE, transactional=True, **FAST)
def capture(order: str, conn: Any = None) -> str:
    return write(cfg, conn, "hop2-celery", order)
