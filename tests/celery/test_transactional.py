"""``transactional=True``: the body's writes and the SUCCESS record commit together (docs/transactional.md),
through a real worker, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore, Status
from idempotent_tasks.celery import IdempotentTask, current_connection, setup
from tests._services import POSTGRES_URL, require

from .conftest import RESULT_TIMEOUT, key, new_app, running_worker

TENANT = "acme"


class Declined(Exception):
    pass


@dataclass
class TxEnv:
    handler: IdempotencyHandler
    store: SQLStore
    ledger: sa.Table
    pay: Any

    def rows(self, order: str) -> int:
        with self.store.engine.connect() as conn:
            query = sa.select(sa.func.count()).where(self.ledger.c.order_id == order)
            return int(conn.execute(query).scalar_one())


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def tx(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxEnv]:
    prefix = f"ct_{uuid.uuid4().hex[:8]}"
    if request.param == "postgres":
        require("postgres")
        store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    else:
        store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('tx') / 'idem.db'}")
    store.create_schema()
    meta = sa.MetaData()
    ledger = sa.Table(
        f"{prefix}_ledger", meta,
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
    )
    meta.create_all(store.engine)
    handler = IdempotencyHandler(store, metrics=None)
    app = new_app(f"tx_{request.param}")
    setup(app, handler)

    @app.task(
        base=IdempotentTask, name="tx.pay", transactional=True, permanent=(Declined,), shared=False
    )
    def pay(order: str, amount: int, conn: Any = None) -> dict[str, Any]:
        assert conn is not None and current_connection() is conn
        conn.execute(ledger.insert().values(order_id=order, amount=amount))
        if amount < 0:
            raise Declined("refund not allowed")
        return {"order": order, "amount": amount}

    try:
        with running_worker(app):
            yield TxEnv(handler, store, ledger, pay)
    finally:
        meta.drop_all(store.engine)
        drop = getattr(store, "drop_schema", None)
        if request.param == "postgres" and callable(drop):
            drop()
        handler.close()
        store.close()


def test_body_writes_commit_with_success_exactly_once(tx: TxEnv) -> None:
    k = key()
    order = f"o-{k}"
    results = [
        tx.pay.apply_async((order, 10), idempotency_key=k, tenant=TENANT).get(timeout=RESULT_TIMEOUT)
        for _ in range(3)
    ]
    assert results == [{"order": order, "amount": 10}] * 3
    assert tx.rows(order) == 1
    record = tx.handler.get_record(operation="tx.pay", tenant=TENANT, key=k)
    assert record.status is Status.SUCCESS


def test_a_body_that_raises_leaves_no_rows(tx: TxEnv) -> None:
    k = key()
    order = f"o-{k}"
    result = tx.pay.apply_async((order, -5), idempotency_key=k, tenant=TENANT)
    with pytest.raises(Declined):
        result.get(timeout=RESULT_TIMEOUT)
    assert tx.rows(order) == 0
    record = tx.handler.get_record(operation="tx.pay", tenant=TENANT, key=k)
    assert record.status is Status.FAILED


