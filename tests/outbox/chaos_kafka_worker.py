"""The Kafka side of the outbox chaos run (``python -m tests.outbox.chaos_kafka_worker``): a
transactional ``KafkaConsumerLoop`` writing ``hop2-kafka``.  A loop that ends on its own exits
the process, and the harness starts a new one, as for a killed one."""

from __future__ import annotations

import os
import threading
from typing import Any

import sqlalchemy as sa

from idempotent_tasks import MaintenanceSchedule
from idempotent_tasks.consumers import IdempotentConsumer
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

from ._chaos_config import AUDIT, ChaosConfig, make_handler, write


def main() -> None:
    cfg = ChaosConfig.from_env()
    consumer = IdempotentConsumer(make_handler(cfg), operation=AUDIT, transactional=True)

    def body(payload: Any, conn: sa.Connection) -> str:
        return write(cfg, conn, "hop2-kafka", str(payload["order"]))

    loop = KafkaConsumerLoop(consumer, {**cfg.kafka, "group.id": cfg.group}, topics=[cfg.topic],
                             retry_backoff=(0.1, 1.0),
                             maintenance=MaintenanceSchedule(recover_every=2.0,
                                                             cleanup_every=600.0))
    try:
        loop.run(body, stop=threading.Event())
    finally:
        os._exit(3)


if __name__ == "__main__":
    main()
