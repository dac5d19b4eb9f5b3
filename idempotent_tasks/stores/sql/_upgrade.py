"""Upgrading, in place, a schema made by an earlier release: the retry counters gain the
``steps`` column (recorded steps live on the counter row) and the records' status check
admits ``'UNCERTAIN'``.

Driver-neutral: every step is SQL text run through ``run(sql)``, which returns the
statement's rows (an empty list for DDL), so ``SQLStore.create_schema()`` (on a SQLAlchemy
connection) and the Django migration (on a Django cursor) share it.  Identifiers come from a
validated table prefix and are quoted by the dialect.  PostgreSQL and MySQL drop and re-add
the named constraint; SQLite cannot alter a constraint, so its records table is rebuilt
(created under a temporary name with the new check, rows copied, the old table dropped and
the new one renamed) inside the caller's transaction — its indexes and token triggers, which
go with the old table, are recreated by ``create_schema`` right after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

#: Columns that a table of an earlier release lacks and the upgrade adds.
UPGRADABLE: Final = frozenset({"steps"})
#: The records' status check as this release writes it.
STATUS_CHECK: Final = "status IN ('PROCESSING', 'SUCCESS', 'FAILED', 'UNCERTAIN')"

Run = Callable[[str], Sequence[Sequence[Any]]]


def upgrade_schema(run: Run, dialect: sa.Dialect, metadata: sa.MetaData, prefix: str) -> None:
    """Add what an earlier release's tables lack (nothing when they are current; tables
    that do not exist yet are left to the caller's ``CREATE``)."""
    records, counters = (metadata.tables[f"{prefix}_{t}"] for t in ("records", "retry_counters"))
    columns = _columns(run, dialect.name, counters.name)
    if columns and "steps" not in columns:
        steps = counters.c.steps.type.compile(dialect=dialect)
        run(f"ALTER TABLE {_quote(dialect, counters.name)} ADD COLUMN steps {steps}")
    if _columns(run, dialect.name, records.name) and not _check_current(
        run, dialect, records, prefix
    ):
        _widen_check(run, dialect, records, f"{prefix}_records_status_ck")


def _quote(dialect: sa.Dialect, name: str) -> str:
    return str(dialect.identifier_preparer.quote(name))


def _columns(run: Run, dialect: str, table: str) -> set[str]:
    """The table's column names (empty when there is no such table)."""
    if dialect == "sqlite":
        rows = run(f"SELECT name FROM pragma_table_info('{table}')")
    else:
        schema = "current_schema()" if dialect == "postgresql" else "DATABASE()"
        rows = run(
            "SELECT column_name FROM information_schema.columns "
            f"WHERE table_schema = {schema} AND table_name = '{table}'"
        )
    return {str(row[0]) for row in rows}


def _check_current(run: Run, dialect: sa.Dialect, records: sa.Table, prefix: str) -> bool:
    """Whether the records' status check already admits UNCERTAIN."""
    table = records.name
    if dialect.name == "sqlite":
        rows = run(f"SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
    elif dialect.name == "postgresql":
        rows = run(  # the quoted name: a prefix may have capitals
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = "
            f"'{prefix}_records_status_ck' AND conrelid = '{_quote(dialect, table)}'::regclass"
        )
    else:
        rows = run(
            "SELECT check_clause FROM information_schema.check_constraints WHERE "
            f"constraint_schema = DATABASE() AND constraint_name = '{prefix}_records_status_ck'"
        )
    return any("UNCERTAIN" in str(row[0]) for row in rows)


def _widen_check(run: Run, dialect: sa.Dialect, records: sa.Table, check: str) -> None:
    table = _quote(dialect, records.name)
    if dialect.name == "sqlite":
        _rebuild_sqlite(run, dialect, records)
        return
    if dialect.name == "postgresql":
        run(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {_quote(dialect, check)}")
    elif _check_exists(run, check):
        run(f"ALTER TABLE {table} DROP CONSTRAINT {_quote(dialect, check)}")
    run(f"ALTER TABLE {table} ADD CONSTRAINT {_quote(dialect, check)} CHECK ({STATUS_CHECK})")


def _check_exists(run: Run, check: str) -> bool:
    return bool(run(
        "SELECT 1 FROM information_schema.check_constraints WHERE "
        f"constraint_schema = DATABASE() AND constraint_name = '{check}'"
    ))


def _rebuild_sqlite(run: Run, dialect: sa.Dialect, records: sa.Table) -> None:
    """SQLite's documented way to change a constraint: a new table, the rows copied, the old
    table dropped (its indexes and triggers with it) and the new one renamed."""
    staging = records.to_metadata(sa.MetaData(), name=f"{records.name}_upgrade")
    run(str(CreateTable(staging).compile(dialect=dialect)))
    cols = ", ".join(_quote(dialect, c.name) for c in records.columns)
    new, old = _quote(dialect, staging.name), _quote(dialect, records.name)
    run(f"INSERT INTO {new} ({cols}) SELECT {cols} FROM {old}")
    run(f"DROP TABLE {old}")
    run(f"ALTER TABLE {new} RENAME TO {old}")


def sa_runner(conn: sa.Connection) -> Run:
    """``run`` on a SQLAlchemy connection."""

    def run(sql: str) -> Sequence[Sequence[Any]]:
        result = conn.exec_driver_sql(sql)
        return list(result.fetchall()) if result.returns_rows else []

    return run
