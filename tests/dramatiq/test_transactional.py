"""``transactional=True``: the body's writes and SUCCESS commit together (docs/transactional.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, Status
from idempotent_tasks.dramatiq import current_connection, idempotent_actor

from .._services import POSTGRES_URL, require
from .conftest import Env, close_env, make_env

FAST: dict[str, Any] = {"min_backoff": 10, "max_backoff": 40}


@pytest.fixture(params=["sqlite", "postgres"])
def sql_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Env, sa.Table]]:
    from idempotent_tasks import SQLStore

    prefix = f"dq_{uuid.uuid4().hex[:8]}"
    if request.param == "postgres":
        require("postgres")
        store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    else:
        store = SQLStore(f"sqlite:///{tmp_path / 'tx.db'}", table_prefix=prefix)
    store.create_schema()
    meta = sa.MetaData()
    ledger = sa.Table(f"{prefix}_ledger", meta, sa.Column("order_id", sa.String, nullable=False))
    engine = sa.create_engine(
        POSTGRES_URL if request.param == "postgres" else f"sqlite:///{tmp_path / 'tx.db'}"
    )
    meta.create_all(engine)
    env = make_env(store)
    try:
        yield env, ledger
    finally:
        close_env(env)
        meta.drop_all(engine)
        engine.dispose()
        store.drop_schema()
        store.close()


def _rows(env: Env, ledger: sa.Table) -> list[str]:
    with env.handler._engine.store.inner.engine.connect() as conn:  # type: ignore[attr-defined]
        return [r[0] for r in conn.execute(sa.select(ledger.c.order_id))]


def test_transactional_effects_exactly_once_and_rolled_back_on_failure(
    sql_env: tuple[Env, sa.Table],
) -> None:
    env, ledger = sql_env
    attempts: list[str] = []

    @idempotent_actor(transactional=True, store_results=True, **FAST)
    def book(order_id: str) -> dict[str, str]:
        conn = current_connection()
        conn.execute(sa.insert(ledger).values(order_id=order_id))
        attempts.append(order_id)
        if order_id == "fails-once" and attempts.count(order_id) == 1:
            raise ConnectionError("after the write: must roll back")
        return {"booked": order_id}

    env.start(threads=2)
    first = book.send_with_options(args=("o-1",), idempotency_key="k1", tenant="acme")
    env.join()
    env.redeliver(first)
    book.send_with_options(args=("o-1",), idempotency_key="k1", tenant="acme")
    flaky = book.send_with_options(args=("fails-once",), idempotency_key="k2", tenant="acme")
    env.join()

    assert sorted(_rows(env, ledger)) == ["fails-once", "o-1"]  # the failed write rolled back
    assert attempts.count("o-1") == 1 and attempts.count("fails-once") == 2
    assert first.get_result(backend=env.backend) == {"booked": "o-1"}
    assert flaky.get_result(backend=env.backend) == {"booked": "fails-once"}
    record = env.handler.get_record(operation="book", tenant="acme", key="k2")
    assert record is not None and record.status is Status.SUCCESS and record.retry_count == 1


def test_transactional_needs_a_sql_store(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(transactional=True, **FAST)
    def book() -> None:
        runs.append(1)

    env.start()
    msg = book.send_with_options(idempotency_key="k", tenant="acme")
    env.join()
    assert runs == []
    assert env.dead_letter_ids() == [msg.message_id]
    exc = env.broker.dead_letters[0]._exception
    assert getattr(exc, "code", None) == ErrorCode.CONFIGURATION_ERROR
