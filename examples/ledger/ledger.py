"""A payments ledger whose rows land exactly once, whatever is killed when.

Each charge is written by ``execute_in_transaction``: the claim commits first, then the
ledger INSERT and the conditional SUCCESS commit together.  A worker killed inside the body
leaves nothing behind; the redelivery (after the lease expires) writes the row once.

Every table the example uses carries its own run's ``prefix`` (idempotency tables and the
ledger alike): pointed at a real database, it creates and drops only what it made itself.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore


def new_prefix() -> str:
    """A table prefix of this run's own (``ledger_<hex>``)."""
    return f"ledger_{secrets.token_hex(4)}"


def ledger_table(prefix: str) -> sa.Table:
    return sa.Table(
        f"{prefix}_entries",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
        sa.Column("worker", sa.Integer, nullable=False),
    )


def open_ledger(
    url: str, prefix: str, *, lease_timeout: float = 2.0
) -> tuple[SQLStore, IdempotencyHandler, sa.Table]:
    """The store, handler and ledger table of the run that owns ``prefix`` (created if
    missing; nothing else in the database is touched)."""
    store = SQLStore(url, table_prefix=prefix)
    store.create_schema()
    table = ledger_table(prefix)
    table.create(store.engine, checkfirst=True)
    handler = IdempotencyHandler(store, lease_timeout=lease_timeout, max_retries=50, metrics=None)
    return store, handler, table


def drop_ledger(store: SQLStore, table: sa.Table) -> None:
    """Drop this run's own tables (its prefix), and only those."""
    table.drop(store.engine, checkfirst=True)
    store.drop_schema()


def charge(handler: IdempotencyHandler, ledger: sa.Table, order_id: str, amount: int,
           worker: int, hold: float = 0.0) -> Any:
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


def rows_per_order(store: SQLStore, ledger: sa.Table) -> dict[str, int]:
    with store.engine.connect() as conn:
        query = sa.select(ledger.c.order_id, sa.func.count()).group_by(ledger.c.order_id)
        return {order_id: int(n) for order_id, n in conn.execute(query)}
