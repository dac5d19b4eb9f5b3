"""``create_schema()`` upgrades, in place, a schema made by the release before recorded steps
and the UNCERTAIN status: the retry counters gain ``steps``, the status check admits
UNCERTAIN, and what was stored survives (records, counters, tokens).

The old schema is that release's own DDL (``postgresql_ddl()`` / ``mysql_ddl()`` and the
SQLite tables, fencing row and triggers its ``create_schema()`` made), kept here as literals
with ``PFX`` standing for the table prefix.
"""

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

_PG_RECORDS = """CREATE TABLE "PFX_records" (
    tenant TEXT COLLATE "C" NOT NULL, operation TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL, status VARCHAR(16) NOT NULL, request_hash TEXT NOT NULL,
    response BYTEA, fencing_token BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, lease_expires_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION,
    CONSTRAINT "PFX_records_pkey" PRIMARY KEY (tenant, operation, key),
    CONSTRAINT "PFX_records_status_ck" CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED'))
)"""
POSTGRES_OLD = [
    _PG_RECORDS,
    'CREATE INDEX "PFX_records_expires_idx" ON "PFX_records" (expires_at)',
    'CREATE INDEX "PFX_records_processing_idx" ON "PFX_records" '
    "(updated_at, tenant, operation, key) WHERE status = 'PROCESSING'",
    """CREATE TABLE "PFX_retry_counters" (
    tenant TEXT COLLATE "C" NOT NULL, operation TEXT COLLATE "C" NOT NULL,
    key TEXT COLLATE "C" NOT NULL, count INTEGER NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    CONSTRAINT "PFX_retry_counters_pkey" PRIMARY KEY (tenant, operation, key))""",
    'CREATE INDEX "PFX_retry_counters_updated_idx" ON "PFX_retry_counters" (updated_at)',
    """CREATE TABLE "PFX_locks" (name TEXT NOT NULL, owner TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL, CONSTRAINT "PFX_locks_pkey" PRIMARY KEY (name))""",
    'CREATE SEQUENCE "PFX_fencing_seq" AS BIGINT START WITH 8 CACHE 1',
]
MYSQL_OLD = [
    """CREATE TABLE `PFX_records` (
    tenant VARBINARY(1020) NOT NULL, operation VARBINARY(1020) NOT NULL,
    `key` VARBINARY(1020) NOT NULL, status VARCHAR(16) NOT NULL, request_hash TEXT NOT NULL,
    response LONGBLOB, fencing_token BIGINT NOT NULL, created_at DOUBLE NOT NULL,
    updated_at DOUBLE NOT NULL, lease_expires_at DOUBLE, expires_at DOUBLE,
    CONSTRAINT `PFX_records_pkey` PRIMARY KEY (tenant, operation, `key`),
    CONSTRAINT `PFX_records_status_ck` CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED'))
)ENGINE=InnoDB CHARSET=utf8mb4""",
    "CREATE INDEX `PFX_records_expires_idx` ON `PFX_records` (expires_at)",
    "CREATE INDEX `PFX_records_fencing_idx` ON `PFX_records` (fencing_token)",
    "CREATE INDEX `PFX_records_status_idx` ON `PFX_records` (status, updated_at)",
    """CREATE TABLE `PFX_retry_counters` (
    tenant VARBINARY(1020) NOT NULL, operation VARBINARY(1020) NOT NULL,
    `key` VARBINARY(1020) NOT NULL, count INTEGER NOT NULL, updated_at DOUBLE NOT NULL,
    CONSTRAINT `PFX_retry_counters_pkey` PRIMARY KEY (tenant, operation, `key`)
)ENGINE=InnoDB CHARSET=utf8mb4""",
    "CREATE INDEX `PFX_retry_counters_updated_idx` ON `PFX_retry_counters` (updated_at)",
    """CREATE TABLE `PFX_locks` (name VARBINARY(1020) NOT NULL, owner TEXT NOT NULL,
    expires_at DOUBLE NOT NULL, CONSTRAINT `PFX_locks_pkey` PRIMARY KEY (name)
)ENGINE=InnoDB CHARSET=utf8mb4""",
    "ALTER TABLE PFX_records MODIFY fencing_token BIGINT NOT NULL AUTO_INCREMENT",
]
_SQLITE_TRIGGER = (
    'CREATE TRIGGER IF NOT EXISTS "PFX_records_fencing_{name}" AFTER {event} ON "PFX_records" '
    'FOR EACH ROW BEGIN UPDATE "PFX_fencing" SET last_token = NEW.fencing_token '
    "WHERE last_token < NEW.fencing_token; END"
)
SQLITE_OLD = [
    """CREATE TABLE "PFX_locks" (name TEXT NOT NULL, owner TEXT NOT NULL,
    expires_at DOUBLE NOT NULL, CONSTRAINT "PFX_locks_pkey" PRIMARY KEY (name))""",
    """CREATE TABLE "PFX_records" (
    tenant TEXT NOT NULL, operation TEXT NOT NULL, "key" TEXT NOT NULL,
    status VARCHAR(16) NOT NULL, request_hash TEXT NOT NULL, response BLOB,
    fencing_token BIGINT NOT NULL, created_at DOUBLE NOT NULL, updated_at DOUBLE NOT NULL,
    lease_expires_at DOUBLE, expires_at DOUBLE,
    CONSTRAINT "PFX_records_pkey" PRIMARY KEY (tenant, operation, "key"),
    CONSTRAINT "PFX_records_status_ck" CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED')))""",
    'CREATE INDEX "PFX_records_expires_idx" ON "PFX_records" (expires_at)',
    'CREATE INDEX "PFX_records_processing_idx" ON "PFX_records" '
    "(updated_at, tenant, operation, \"key\") WHERE status = 'PROCESSING'",
    """CREATE TABLE "PFX_retry_counters" (
    tenant TEXT NOT NULL, operation TEXT NOT NULL, "key" TEXT NOT NULL, count INTEGER NOT NULL,
    updated_at DOUBLE NOT NULL,
    CONSTRAINT "PFX_retry_counters_pkey" PRIMARY KEY (tenant, operation, "key"))""",
    'CREATE INDEX "PFX_retry_counters_updated_idx" ON "PFX_retry_counters" (updated_at)',
    """CREATE TABLE "PFX_fencing" (id INTEGER NOT NULL, last_token BIGINT NOT NULL,
    PRIMARY KEY (id), CONSTRAINT "PFX_fencing_one_row_ck" CHECK (id = 1))""",
    'INSERT INTO "PFX_fencing" (id, last_token) VALUES (1, 7)',
    _SQLITE_TRIGGER.format(name="insert", event="INSERT"),
    _SQLITE_TRIGGER.format(name="update", event="UPDATE OF fencing_token"),
]
OLD = {"sqlite": SQLITE_OLD, "postgres": POSTGRES_OLD, "mysql": MYSQL_OLD}

#: The record and the counter the old release left behind.
KEPT = Scope("acme", "payments.charge", "kept")
NOW = 1_700_000_000.0
_RECORD = (
    "INSERT INTO {records} (tenant, operation, {key}, status, request_hash, response, "
    "fencing_token, created_at, updated_at, lease_expires_at, expires_at) VALUES "
    "('acme', 'payments.charge', 'kept', 'SUCCESS', 'h', :ok, 7, {now}, {now}, NULL, {exp})"
)
_COUNTER = (
    "INSERT INTO {counters} (tenant, operation, {key}, count, updated_at) "
    "VALUES ('acme', 'payments.charge', 'kept', 2, {now})"
)


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
    quote = "`" if kind == "mysql" else '"'
    names = {
        "records": f"{quote}{prefix}_records{quote}", "key": f"{quote}key{quote}",
        "counters": f"{quote}{prefix}_retry_counters{quote}", "now": NOW, "exp": NOW + 10**6,
    }
    try:
        with engine.begin() as conn:
            for statement in OLD[kind]:
                conn.exec_driver_sql(statement.replace("PFX", prefix))
            conn.execute(sa.text(_RECORD.format(**names)), {"ok": b"ok"})
            conn.exec_driver_sql(_COUNTER.format(**names))
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
    finally:
        engine.dispose()
        store.drop_schema()
        store.close()
