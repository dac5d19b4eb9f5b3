"""Consume the ``orders`` queue from RabbitMQ with exactly-once effects per idempotency key.

Run against the docker-compose services (``docker compose up -d``)::

    python examples/rabbitmq_consumer.py            # consumes until Ctrl-C / SIGTERM
    python examples/rabbitmq_consumer.py --publish  # publishes a few orders, with duplicates

The loop declares ``orders`` (with ``x-dead-letter-exchange: orders.dlx``), the exchange
``orders.dlx`` and the queue ``orders.dead``.  Duplicates replay the stored result; poisoned
and invalid messages land in ``orders.dead`` with ``idempotency-*`` headers; a message whose
scope is busy or whose store is down is held and requeued with backoff, never acked early.
Settings: ``RABBITMQ_URL`` (default ``amqp://guest:guest@localhost:5672//``) and
``STORE_URL`` (default the compose PostgreSQL; ``redis://…`` and ``sqlite:///…`` work too).
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
from idempotent_tasks.consumers.rabbitmq import RabbitMQConsumerLoop

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672//")
STORE_URL = os.environ.get("STORE_URL", "postgresql+psycopg://postgres@localhost:5432/test")


#: This example's own operation: the Kafka and RabbitMQ examples share the default store
#: and order numbers, and must not replay each other's charges.
OPERATION = "rabbitmq_example.orders.charge"


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


def publish(loop: RabbitMQConsumerLoop) -> None:
    from kombu import Connection  # type: ignore[attr-defined]

    loop.declare()
    run = uuid.uuid4().hex[:8]  # a new batch of orders per run; its duplicates reuse its keys
    orders = [(f"o-1-{run}", "acme", 100), (f"o-2-{run}", "acme", 250),
              (f"o-3-{run}", "globex", -5)]
    with Connection(RABBITMQ_URL) as conn:  # type: ignore[no-untyped-call]
        producer = conn.Producer()
        for key, tenant, amount in orders + orders[:2]:  # the first two twice: duplicates
            producer.publish(
                json.dumps({"customer": tenant, "amount": amount}).encode(), exchange="",
                routing_key="orders", content_type="application/json", content_encoding="utf-8",
                headers={"idempotency-key": key, "idempotency-tenant": tenant},
            )
    print("published 5 messages (2 duplicates, 1 invalid)")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    handler = IdempotencyHandler(make_store(STORE_URL), lease_timeout=60, heartbeat_interval=15)
    consumer = IdempotentConsumer(handler, operation=OPERATION, permanent=(InvalidOrder,))
    loop = RabbitMQConsumerLoop(
        consumer, RABBITMQ_URL, queue="orders", prefetch=16,
        on_outcome=lambda msg, out: print(f"tag {msg.offset}: {out.kind} {out.result or ''}"),
    )
    if "--publish" in sys.argv:
        publish(loop)
        return
    loop.run(charge)  # blocks until SIGTERM / Ctrl-C; requeues what it holds, then closes


if __name__ == "__main__":
    main()
