"""A payments ledger whose rows land exactly once, whatever is killed when.

Each charge is written by ``execute_in_transaction``: the claim commits first, then the
ledger INSERT and the conditional SUCCESS commit together.  A worker killed inside the body
leaves nothing behind; the redelivery (after the lease expires) writes the row once.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore

metadata = sa.MetaData()
ledger = sa.Table(
    "ledger_entries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Column("worker", sa.Integer, nullable=False),
)


def open_ledger(url: str, *, lease_timeout: float = 2.0) -> tuple[SQLStore, IdempotencyHandler]:
    store = SQLStore(url)
    store.create_schema()
    metadata.create_all(store.engine)
    handler = IdempotencyHandler(store, lease_timeout=lease_timeout, max_retries=50, metrics=None)
    return store, handler


def reset(store: SQLStore) -> None:
    """Start afresh: drop the idempotency tables and the ledger, then create them again."""
    metadata.drop_all(store.engine)
    store.drop_schema()
    store.create_schema()
    metadata.create_all(store.engine)


def charge(handler: IdempotencyHandler, order_id: str, amount: int, worker: int,
           hold: float = 0.0) -> Any:
    """One delivery of the charge for ``order_id`` (any number of deliveries, one row)."""

    def body(conn: sa.Connection) -> dict[str, Any]:
        conn.execute(sa.insert(ledger).values(order_id=order_id, amount=amount, worker=worker))
        if hold:
            time.sleep(hold)  # a wider window for a kill to land inside the body
        return {"order_id": order_id, "charged": amount}

    return handler.execute_in_transaction(
        body, operation="ledger.charge", tenant="acme", key=f"charge-{order_id}",
        payload={"order_id": order_id, "amount": amount},
    )


def rows_per_order(store: SQLStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        query = sa.select(ledger.c.order_id, sa.func.count()).group_by(ledger.c.order_id)
        return {order_id: int(n) for order_id, n in conn.execute(query)}
