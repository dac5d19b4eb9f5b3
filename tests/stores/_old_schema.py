"""The schema of the release before recorded steps and the UNCERTAIN status, as that
release's own DDL (``postgresql_ddl()`` / ``mysql_ddl()`` and the SQLite tables, fencing row
and triggers its ``create_schema()`` made), kept as literals with ``PFX`` standing for the
table prefix: what the upgrade tests start from."""

from __future__ import annotations

import sqlalchemy as sa

from idempotent_tasks._core.records import Scope

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


def create_old_schema(conn: sa.Connection, kind: str, prefix: str) -> None:
    """The old schema of ``kind`` (sqlite, postgres, mysql) on ``conn``, holding :data:`KEPT`
    (a SUCCESS record with token 7 and the response ``b"ok"``, its counter at 2)."""
    quote = "`" if kind == "mysql" else '"'
    names = {
        "records": f"{quote}{prefix}_records{quote}", "key": f"{quote}key{quote}",
        "counters": f"{quote}{prefix}_retry_counters{quote}", "now": NOW, "exp": NOW + 10**6,
    }
    for statement in OLD[kind]:
        conn.exec_driver_sql(statement.replace("PFX", prefix))
    conn.execute(sa.text(_RECORD.format(**names)), {"ok": b"ok"})
    conn.exec_driver_sql(_COUNTER.format(**names))
