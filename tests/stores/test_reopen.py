"""``reopen`` (``stores/reopen.py``) beyond the contract's rules (``StoreContract`` checks its
behaviour on every store kind): every built-in store has it with the Protocol's signature,
and on PostgreSQL it is one statement (the record, its token and the counter reset)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from idempotent_tasks import (
    AsyncRedisStore,
    AsyncSQLStore,
    DynamoDBStore,
    MemoryStore,
    RedisStore,
    SQLStore,
)
from idempotent_tasks.stores import AsyncReopenStore, ReopenStore, Scope
from idempotent_tasks.stores.sql.protocol import ROWS, postgres_plans

S = Scope("acme", "reports.daily", "k-1")
NOW = 1_700_000_000.0


@pytest.mark.parametrize("store", [MemoryStore, SQLStore, RedisStore, DynamoDBStore],
                         ids=lambda cls: cls.__name__)
def test_every_built_in_sync_store_reopens(store: type[Any]) -> None:
    assert not inspect.iscoroutinefunction(store.reopen)
    assert inspect.signature(store.reopen) == inspect.signature(ReopenStore.reopen)


@pytest.mark.parametrize("store", [AsyncSQLStore, AsyncRedisStore],
                         ids=lambda cls: cls.__name__)
def test_every_built_in_async_store_reopens(store: type[Any]) -> None:
    assert inspect.iscoroutinefunction(store.reopen)
    assert inspect.signature(store.reopen) == inspect.signature(AsyncReopenStore.reopen)


def test_django_store_inherits_the_sql_stores_reopen() -> None:
    pytest.importorskip("django")
    from idempotent_tasks.django import DjangoStore

    assert DjangoStore.reopen is SQLStore.reopen


def test_postgres_reopen_is_one_statement() -> None:
    """One round trip: the conditional UPDATE drawing the token, and the counter's DELETE,
    in one statement; its rows are the drawn token (none: refused)."""
    plans = postgres_plans("p")
    for rows, answer in (([(42,)], 42), ([], None)):
        plan = plans.reopen(S, expected_token=7, now=NOW, lease_expires_at=NOW + 30)
        sql, params, fetch = next(plan)
        assert fetch == ROWS
        assert params == {**S._asdict(), "token": 7, "now": NOW, "lease": NOW + 30}
        assert sql.startswith("WITH upd AS (UPDATE") and "nextval(" in sql
        assert "DELETE FROM" in sql and "status IN ('SUCCESS', 'FAILED')" in sql
        with pytest.raises(StopIteration) as done:
            plan.send(rows)
        assert done.value.value == answer
