"""A payments service whose charges run exactly once per order, on Celery.

Run it (see README.md): a RabbitMQ broker, Redis for results, the idempotency records in
SQLite (or PostgreSQL via IDEMPOTENCY_STORE), a worker and beat for recovery/cleanup.
"""

from __future__ import annotations

import os
import random
from typing import Any

import sqlalchemy as sa
from celery import Celery

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.celery import current_connection, idempotent_task, setup

app = Celery(
    "payments",
    broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
app.conf.task_time_limit = 120  # below lease_timeout: a running body's lease never expires

store = SQLStore(os.environ.get("IDEMPOTENCY_STORE", "sqlite:///payments-idempotency.db"))
handler = IdempotencyHandler(store, lease_timeout=300, max_retries=5)
setup(app, handler)  # + beat entries idempotency.recover_stuck / idempotency.cleanup_expired

ledger = sa.Table(
    "payments_ledger", sa.MetaData(),
    sa.Column("order_id", sa.String(64), primary_key=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


class CardDeclined(Exception):
    """Permanent: retrying will not help; the scope is poisoned, the task fails."""


class GatewayTimeout(Exception):
    """Transient: counted, retried with Celery's backoff until max_retries."""


@idempotent_task(
    name="payments.charge",
    permanent=(CardDeclined,),
    key=lambda order_id, amount_cents, customer: f"charge-{order_id}",
    tenant=lambda order_id, amount_cents, customer: customer,
    retry_backoff=True,
    retry_backoff_max=60,
)
def charge(order_id: str, amount_cents: int, customer: str) -> dict[str, Any]:
    """Call the card gateway (an effect outside our database: at-least-once on a crash)."""
    if amount_cents <= 0:
        raise CardDeclined(f"invalid amount {amount_cents}")
    if random.random() < 0.2:
        raise GatewayTimeout("the gateway did not answer")
    return {"order_id": order_id, "charged": amount_cents, "gateway_ref": f"gw-{order_id}"}


@idempotent_task(name="payments.record", transactional=True)
def record_payment(order_id: str, amount_cents: int, conn: Any = None) -> dict[str, Any]:
    """Write to the same database as the store: the row and SUCCESS commit together."""
    assert conn is current_connection()
    conn.execute(ledger.insert().values(order_id=order_id, amount_cents=amount_cents))
    return {"order_id": order_id, "recorded": True}


def create_tables() -> None:
    store.create_schema()
    ledger.metadata.create_all(store.engine)


if __name__ == "__main__":
    create_tables()
    key = "6f1c9a1e-2a31-4d59-9a0f-0c7e3b1d2f40"
    for _ in range(3):  # the client retries: one charge, three identical results
        print(charge.delay("order-42", 1999, "acme").get(timeout=30))
    print(record_payment.apply_async(("order-42", 1999), idempotency_key=key, tenant="acme")
          .get(timeout=30))
