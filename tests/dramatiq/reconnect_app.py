"""The Dramatiq app of ``test_reconnect.py``'s worker subprocess (one process, two threads).

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

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from idempotent_tasks import IdempotencyHandler, RedisStore, create_logger_adapter
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor
from tests._services import REDIS_URL

PREFIX = os.environ["IT_RC_PREFIX"]
GATED = os.environ["IT_RC_GATED"]
r = redis.Redis.from_url(REDIS_URL, socket_timeout=120)  # the gate blocks (BLPOP)


def _log(level: str, event: str, fields: Mapping[str, Any]) -> None:
    if event in ("duplicate_in_progress", "duplicate_replayed"):
        r.rpush(f"{PREFIX}:{event}", str(fields.get("key")))


handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=PREFIX), metrics=None,
                             lease_timeout=30, logger=create_logger_adapter(_log))
broker = RabbitmqBroker(url=os.environ["IT_RC_BROKER"])
broker.add_middleware(IdempotencyMiddleware(handler, maintenance=False))
dramatiq.set_broker(broker)


@idempotent_actor(queue_name=os.environ["IT_RC_QUEUE"], min_backoff=200, max_backoff=600)
def charge(key: str) -> None:
    if key == GATED and r.set(f"{PREFIX}:gated-started", 1, nx=True):
        r.rpush(f"{PREFIX}:in-gate", os.getpid())
        if r.blpop([f"{PREFIX}:gate"], timeout=90) is None:
            raise TimeoutError("the test never opened the gate")
    r.hincrby(f"{PREFIX}:effects", key, 1)
