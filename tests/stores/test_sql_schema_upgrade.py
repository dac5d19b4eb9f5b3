"""``create_schema()`` upgrades, in place, a schema made by the release before recorded steps
and the UNCERTAIN status (``tests/stores/_old_schema.py``): the retry counters gain
``steps``, the status check admits UNCERTAIN, and what was stored survives (records,
counters, tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import SQLStore, Status
from idempotent_tasks._core.records import Scope

from .._services import POSTGRES_URL, require
from ..conftest import unique_prefix
from ._backends import mysql_url
from ._old_schema import KEPT, NOW, SQLITE_OLD, create_old_schema


def url_of(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    if kind == "postgres":
        require("postgres")
        return POSTGRES_URL
    return mysql_url()


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLStore]:
    """A store over the previous release's schema, holding :data:`KEPT` (token 7, count 2)."""
    kind: str = request.param
    prefix = unique_prefix("up")
    store = SQLStore(url_of(kind, tmp_path), table_prefix=prefix)
    engine = sa.create_engine(url_of(kind, tmp_path))
    try:
        with engine.begin() as conn:
            create_old_schema(conn, kind, prefix)
        yield store
    finally:
        engine.dispose()
        store.drop_schema()
        store.close()


def claim(store: SQLStore, key: str) -> int:
    result = store.create(Scope("acme", "payments.charge", key), request_hash="h", now=NOW,
                          lease_expires_at=NOW + 30)
    assert result.created
    return result.record.fencing_token


def test_create_schema_upgrades_the_previous_release_in_place(old_store: SQLStore) -> None:
    store = old_store
    store.create_schema()
    store.create_schema()  # idempotent: nothing left to upgrade
    kept = store.get(KEPT)
    assert kept is not None and kept.status is Status.SUCCESS and kept.response == b"ok"
    assert kept.fencing_token == 7 and store.get_retry_count(KEPT) == 2
    assert store.load_steps(KEPT) is None  # the new column, empty on old rows
    first, second = claim(store, "new-1"), claim(store, "new-2")
    assert 7 < first < second  # the token source (SQLite: its triggers) still works
    scope = Scope("acme", "payments.charge", "new-1")
    assert store.save_steps(scope, token=first, steps=b"steps", now=NOW + 1)
    assert store.load_steps(scope) == b"steps"
    assert store.mark_uncertain(scope, token=first, now=NOW + 2, detail=b"unknown")
    got = store.get(scope)
    assert got is not None and got.status is Status.UNCERTAIN
    assert store.list_records(status=Status.UNCERTAIN)[0].scope == scope
    taken = store.take_over(Scope("acme", "payments.charge", "new-2"), expected_token=second,
                            now=NOW + 31, lease_expires_at=NOW + 61)
    assert taken is not None and taken.token > second


def test_the_upgraded_sqlite_table_keeps_its_indexes_and_triggers(tmp_path: Path) -> None:
    """SQLite rebuilds the records table: the indexes and the token triggers that went with
    the old one are there again."""
    prefix = unique_prefix("up")
    url = url_of("sqlite", tmp_path)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in SQLITE_OLD:
            conn.exec_driver_sql(statement.replace("PFX", prefix))
    store = SQLStore(url, table_prefix=prefix)
    try:
        store.create_schema()
        with engine.connect() as conn:
            rows: Any = conn.exec_driver_sql(
                "SELECT type, name FROM sqlite_master WHERE tbl_name = ?", (f"{prefix}_records",)
            ).fetchall()
        found = {(t, n.removeprefix(prefix)) for t, n in rows if not n.startswith("sqlite_")}
        assert found == {
            ("table", "_records"), ("index", "_records_expires_idx"),
            ("index", "_records_processing_idx"), ("trigger", "_records_fencing_insert"),
            ("trigger", "_records_fencing_update"),
        }
        assert "WHERE expires_at IS NOT NULL" in expires_index_sql(engine, prefix)
    finally:
        engine.dispose()
        store.drop_schema()
        store.close()


def expires_index_sql(engine: sa.Engine, prefix: str) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE name = ?", (f"{prefix}_records_expires_idx",)
        ).scalar())


def test_sqlite_expires_index_made_full_by_an_earlier_release_becomes_partial(
    tmp_path: Path,
) -> None:
    """Earlier releases indexed every record's ``expires_at`` (NULL while in flight);
    ``create_schema`` rebuilds the index partial, and the clean-up still searches it."""
    prefix = unique_prefix("up")
    url = url_of("sqlite", tmp_path)
    engine = sa.create_engine(url)
    store = SQLStore(url, table_prefix=prefix)
    try:
        store.create_schema()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP INDEX {prefix}_records_expires_idx")
            conn.exec_driver_sql(
                f"CREATE INDEX {prefix}_records_expires_idx ON {prefix}_records (expires_at)"
            )
        assert "WHERE" not in expires_index_sql(engine, prefix)
        store.create_schema()
        assert "WHERE expires_at IS NOT NULL" in expires_index_sql(engine, prefix)
        cleanup = store._plans.ops._delete_records_sql  # type: ignore[attr-defined]
        with engine.connect() as conn:
            plan = conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {cleanup}", {"now": NOW, "limit": 10}
            ).fetchall()
        assert any(f"INDEX {prefix}_records_expires_idx" in str(row[-1]) for row in plan), plan
    finally:
        engine.dispose()
        store.drop_schema()
        store.close()
