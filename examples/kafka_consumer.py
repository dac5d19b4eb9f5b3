"""Consume ``orders`` from Kafka with exactly-once effects per idempotency key.

Run against the docker-compose services (``docker compose up -d``)::

    python examples/kafka_consumer.py            # consumes until Ctrl-C / SIGTERM
    python examples/kafka_consumer.py --produce  # publishes a few orders, with duplicates

Each order is charged once, however often it is delivered: duplicates (same
``idempotency-key`` header) replay the stored result, poisoned and invalid messages go to
``orders.dlq`` with ``idempotency-*`` headers, and a store outage pauses the partition
instead of losing or committing anything.  Settings: ``KAFKA_BOOTSTRAP`` (default
``localhost:9092``) and ``STORE_URL`` (default the compose PostgreSQL; ``redis://…`` and
``sqlite:///…`` work too).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from typing import Any

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks.consumers import IdempotentConsumer
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")
STORE_URL = os.environ.get("STORE_URL", "postgresql+psycopg://postgres@localhost:5432/test")


#: This example's own operation: the Kafka and RabbitMQ examples share the default store
#: and order numbers, and must not replay each other's charges.
OPERATION = "kafka_example.orders.charge"


class InvalidOrder(Exception):
    """A permanent failure: retrying cannot help, so the message is poisoned."""


def make_store(url: str) -> Any:
    if url.startswith(("redis://", "rediss://")):
        from idempotent_tasks import RedisStore

        return RedisStore(url)
    from idempotent_tasks import SQLStore

    store = SQLStore(url)
    store.create_schema()
    return store


def charge(order: dict[str, Any]) -> dict[str, Any]:
    if order.get("amount", 0) <= 0:
        raise InvalidOrder(f"amount must be positive: {order!r}")
    print(f"charging {order['customer']} {order['amount']}")  # the side effect, once per key
    return {"charged": order["amount"], "receipt": uuid.uuid4().hex[:8]}


def produce() -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    run = uuid.uuid4().hex[:8]  # a new batch of orders per run; its duplicates reuse its keys
    orders = [(f"o-1-{run}", "acme", 100), (f"o-2-{run}", "acme", 250),
              (f"o-3-{run}", "globex", -5)]
    for key, tenant, amount in orders + orders[:2]:  # the first two twice: duplicates
        producer.produce(
            "orders", key=key, value=json.dumps({"customer": tenant, "amount": amount}),
            headers={"idempotency-key": key, "idempotency-tenant": tenant},
        )
    producer.flush(10)
    print("produced 5 messages (2 duplicates, 1 invalid)")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    handler = IdempotencyHandler(make_store(STORE_URL), lease_timeout=60, heartbeat_interval=15)
    consumer = IdempotentConsumer(handler, operation=OPERATION, permanent=(InvalidOrder,))
    loop = KafkaConsumerLoop(
        consumer,
        {"bootstrap.servers": BOOTSTRAP, "group.id": "orders-charger"},
        topics=["orders"],
        dead_letter_topic="orders.dlq",
        on_outcome=lambda msg, out: print(f"offset {msg.offset}: {out.kind} {out.result or ''}"),
    )
    loop.run(charge)  # blocks until SIGTERM / Ctrl-C; commits what is done, then leaves


if __name__ == "__main__":
    if "--produce" in sys.argv:
        produce()
    else:
        main()
