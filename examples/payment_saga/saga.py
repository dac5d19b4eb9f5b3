"""A payment saga across Celery and Kafka, each step exactly once, with the outbox.

1. ``payments.charge`` (a Celery task, ``transactional=True``) writes the charge to the
   ledger and, in the same transaction, stages the event ``payment.charged`` on Kafka.
2. The shipping service (a Kafka consumer, ``transactional=True``) reserves the shipment and
   stages the Celery task ``orders.mark_shipped`` — again in its own transaction.
3. ``orders.mark_shipped`` (Celery, ``transactional=True``) marks the order shipped.

A relay (``idempotent-tasks relay``, or a thread here) publishes what each step staged.  It
publishes at least once; every receiver deduplicates by the key the outbox gave the message
(derived from the sender's scope and the message's position), so each step's database effect
happens once, whatever is killed or redelivered.  Everything is in one SQL database (the
store's), as the transactional mode requires: the ledger, the shipments, the orders.

Configuration comes from the environment (``run.py`` sets it): ``SAGA_STORE`` (a SQLStore
URL), ``SAGA_PREFIX`` (the table prefix), ``SAGA_BROKER`` (Celery's broker), ``SAGA_KAFKA``
(bootstrap servers) and ``SAGA_TOPIC``.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from celery import Celery

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.celery import IdempotentTask, setup
from idempotent_tasks.consumers import IdempotentConsumer

PREFIX = os.environ.get("SAGA_PREFIX", "saga")
TOPIC = os.environ.get("SAGA_TOPIC", "payments")
store = SQLStore(os.environ.get("SAGA_STORE", "sqlite:///saga.db"), table_prefix=PREFIX)
handler = IdempotencyHandler(store, metrics=None)

metadata = sa.MetaData()
ledger = sa.Table(f"{PREFIX}_ledger", metadata,
                  sa.Column("order_id", sa.String(64), primary_key=True),
                  sa.Column("amount", sa.Integer, nullable=False))
shipments = sa.Table(f"{PREFIX}_shipments", metadata,
                     sa.Column("order_id", sa.String(64), primary_key=True),
                     sa.Column("carrier", sa.String(32), nullable=False))
orders = sa.Table(f"{PREFIX}_orders", metadata,
                  sa.Column("order_id", sa.String(64), primary_key=True),
                  sa.Column("status", sa.String(16), nullable=False))

app = Celery("payment-saga", broker=os.environ.get("SAGA_BROKER", "memory://"),
             set_as_current=False)
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                # the relay's publishes return only once the broker has them
                broker_transport_options={"confirm_publish": True},
                worker_hijack_root_logger=False)
setup(app, handler, beat=False)


@app.task(base=IdempotentTask, name="payments.charge", transactional=True)
def charge(order_id: str, amount: int, conn: Any = None, outbox: Any = None) -> str:
    """Step 1: the charge and its event commit together, or neither does."""
    conn.execute(sa.insert(ledger).values(order_id=order_id, amount=amount))
    outbox.kafka_record(TOPIC, {"order_id": order_id, "amount": amount}, key=order_id)
    return "charged"


def reserve_shipment(payload: dict[str, Any], conn: sa.Connection, outbox: Any) -> str:
    """Step 2 (the Kafka consumer's body): the shipment and the follow-up commit together."""
    conn.execute(sa.insert(shipments).values(order_id=payload["order_id"], carrier="parcel"))
    outbox.celery_task("orders.mark_shipped", [payload["order_id"]])
    return "reserved"


shipping = IdempotentConsumer(handler, operation="shipping.reserve", transactional=True)


@app.task(base=IdempotentTask, name="orders.mark_shipped", transactional=True)
def mark_shipped(order_id: str, conn: Any = None) -> str:
    """Step 3: the saga's last effect."""
    conn.execute(sa.insert(orders).values(order_id=order_id, status="SHIPPED"))
    return "shipped"


def create_tables() -> None:
    """The store's tables, the outbox's and the saga's own."""
    from idempotent_tasks.outbox import Outbox

    store.create_schema()
    Outbox(store).create_schema()  # the outbox creates its own tables
    metadata.create_all(store.engine)


def drop_tables() -> None:
    from idempotent_tasks.outbox import Outbox

    metadata.drop_all(store.engine)
    Outbox(store).drop_schema()
    store.drop_schema()


def counts() -> dict[str, int]:
    with store.engine.connect() as conn:
        return {t.name.removeprefix(f"{PREFIX}_"): int(conn.execute(
            sa.select(sa.func.count()).select_from(t)).scalar_one()) for t in (ledger, shipments,
                                                                               orders)}
