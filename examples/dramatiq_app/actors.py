"""A runnable Dramatiq app with exactly-once actors (see README.md for the commands).

Configuration (environment): ``BROKER_URL`` (``amqp://…`` or ``redis://…``, default
RabbitMQ on localhost) and ``STORE_URL`` (default ``sqlite:///idem.db``; every worker process
must share the store — use PostgreSQL or Redis across hosts).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from sqlalchemy import text

from idempotent_tasks import IdempotencyHandler, SQLStore, current_context
from idempotent_tasks.dramatiq import IdempotencyMiddleware, current_connection, idempotent_actor

BROKER_URL = os.environ.get("BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
STORE_URL = os.environ.get("STORE_URL", "sqlite:///idem.db")


def _broker(url: str) -> dramatiq.Broker:
    if url.startswith("redis"):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url)  # type: ignore[no-untyped-call]
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    return RabbitmqBroker(url=url)


store = SQLStore(STORE_URL)
store.create_schema()  # idempotent; `idempotent-tasks --store URL migrate` does the same
handler = IdempotencyHandler(store)
broker = _broker(BROKER_URL)
broker.add_middleware(IdempotencyMiddleware(handler))  # before any actor is declared
dramatiq.set_broker(broker)


class CardDeclined(Exception):
    """Permanent: retrying cannot help, so the scope is poisoned and the message dead-lettered."""


@idempotent_actor(permanent=(CardDeclined,), max_retries=3, min_backoff=1_000, max_backoff=30_000)
def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
    ctx = current_context()
    print(f"charging {order_id}: {amount_cents} (key={ctx.key if ctx else None})")
    if amount_cents <= 0:
        raise CardDeclined(order_id)
    return {"order_id": order_id, "charged": amount_cents}


@idempotent_actor(transactional=True, key=lambda order_id: f"ship-{order_id}", tenant="acme")
def ship(order_id: str) -> str:
    """Database effects commit with the scope's SUCCESS, exactly once (SQLStore only)."""
    conn = current_connection()
    conn.execute(text("CREATE TABLE IF NOT EXISTS shipments (order_id TEXT PRIMARY KEY)"))
    conn.execute(text("INSERT INTO shipments (order_id) VALUES (:o)"), {"o": order_id})
    return order_id


if __name__ == "__main__":
    import uuid

    key = str(uuid.uuid4())
    for _ in range(3):  # three deliveries, one charge
        charge.send_with_options(args=("order-1", 1250), idempotency_key=key, tenant="acme")
    ship.send("order-1")
    ship.send("order-1")
    print(f"sent 3 charges with key {key} and 2 shipments; start a worker to process them")
