"""The Celery app of ``test_reconnect.py``'s worker subprocess (prefork, two children).

Configured from the environment: ``IT_RC_BROKER`` (a RabbitMQ vhost of the test's own),
``IT_RC_QUEUE``, ``IT_RC_PREFIX`` (the Redis store's prefix and the test's own keys),
``IT_RC_GATED`` (the key whose first run blocks).  Under ``<prefix>:`` in Redis:
``effects`` (key → effects counted), ``in-gate`` (who entered the gated body), ``gate``
(pushed by the test to let it go), and the keys of the engine's ``duplicate_in_progress``
and ``duplicate_replayed`` events (a delivery refused because another attempt holds the
scope; a delivery answered with the stored result).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery

from idempotent_tasks import IdempotencyHandler, RedisStore, create_logger_adapter
from idempotent_tasks.celery import idempotent_task, setup
from tests._services import REDIS_URL

PREFIX = os.environ["IT_RC_PREFIX"]
GATED = os.environ["IT_RC_GATED"]
r = redis.Redis.from_url(REDIS_URL, socket_timeout=120)  # the gate blocks (BLPOP)

app = Celery("reconnect", broker=os.environ["IT_RC_BROKER"])
app.conf.update(
    task_default_queue=os.environ["IT_RC_QUEUE"], worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True, task_ignore_result=True,
)


def _log(level: str, event: str, fields: Mapping[str, Any]) -> None:
    if event in ("duplicate_in_progress", "duplicate_replayed"):
        r.rpush(f"{PREFIX}:{event}", str(fields.get("key")))


handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=PREFIX), metrics=None,
                             lease_timeout=30, logger=create_logger_adapter(_log))
setup(app, handler, beat=False)


@idempotent_task(name="reconnect.charge", wait_backoff=(0.3, 0.6))
def charge(key: str) -> str:
    if key == GATED and r.set(f"{PREFIX}:gated-started", 1, nx=True):
        r.rpush(f"{PREFIX}:in-gate", os.getpid())
        if r.blpop([f"{PREFIX}:gate"], timeout=90) is None:
            raise TimeoutError("the test never opened the gate")
    r.hincrby(f"{PREFIX}:effects", key, 1)
    return key

