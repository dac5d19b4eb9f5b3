"""A ``KafkaConsumerLoop`` *process* for the rebalance tests:
``python _rebalance_worker.py CONFIG_JSON`` (runs until SIGTERM).

The store is Redis under the test's own prefix, shared by every worker; so is what the
test observes, all under ``<prefix>:``:

* ``effects`` — a hash: message key → how many times its body ran to its effect;
* ``outcomes`` — a list of ``{worker, partition, offset, key, kind}``, one per decision;
* ``events`` — a list of ``{worker, event, partitions}`` for the loop's rebalance events
  (``partitions_assigned`` / ``_revoked`` / ``_lost``) and its stop;
* ``hold`` — while this key exists, a message with ``"hold": true`` fails transiently (a
  retry the loop must not commit past);
* ``gate`` / ``in-gate`` — a message with ``"gate": true`` pushes the worker's name to
  ``in-gate`` and blocks until the test pushes to ``gate`` (a body in progress).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import redis

from idempotent_tasks import IdempotencyHandler, RedisStore, create_logger_adapter
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

REBALANCE_EVENTS = ("partitions_assigned", "partitions_revoked", "partitions_lost",
                    "consumer_stopped")


class Held(Exception):
    """The transient failure of a held message."""


def main() -> None:
    cfg = json.loads(sys.argv[1])
    name, prefix = cfg["name"], cfg["prefix"]
    r = redis.Redis.from_url(cfg["redis"], socket_timeout=120)  # the gate blocks (BLPOP)

    def log(level: str, event: str, fields: Mapping[str, Any]) -> None:
        if event in REBALANCE_EVENTS:
            r.rpush(f"{prefix}:events", json.dumps(
                {"worker": name, "event": event, "partitions": fields.get("partitions")}))

    handler = IdempotencyHandler(
        RedisStore(cfg["redis"], prefix=prefix), metrics=None, lease_timeout=30,
        logger=create_logger_adapter(log),
    )
    consumer = IdempotentConsumer(handler, operation="orders.created", default_tenant="acme",
                                  max_retries=10_000)

    def body(payload: dict[str, Any]) -> str:
        key = payload["key"]
        if payload.get("hold") and r.exists(f"{prefix}:hold"):
            raise Held(key)
        if payload.get("gate"):
            r.rpush(f"{prefix}:in-gate", name)
            if r.blpop([f"{prefix}:gate"], timeout=60) is None:
                raise TimeoutError("the test never opened the gate")
        r.hincrby(f"{prefix}:effects", key, 1)
        return str(key)

    def on_outcome(message: Message, outcome: Outcome) -> None:
        r.rpush(f"{prefix}:outcomes", json.dumps({
            "worker": name, "partition": message.partition, "offset": message.offset,
            "key": outcome.key, "kind": outcome.kind,
        }))

    loop = KafkaConsumerLoop(
        consumer, cfg["kafka"], topics=[cfg["topic"]], retry_backoff=(0.2, 0.5),
        maintenance=False, on_outcome=on_outcome,
    )
    loop.run(body)  # until SIGTERM: the message in hand finishes, commits, the group is left


if __name__ == "__main__":
    main()
