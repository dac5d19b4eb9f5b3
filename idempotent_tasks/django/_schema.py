"""The app's tables on Django's connection: the same schema ``SQLStore.create_schema()``
builds, so ``SQLStore`` and ``DjangoStore`` can share one database.

The DDL is compiled from :func:`~idempotent_tasks.stores.sql.build_metadata` (the tables and
indexes ``SQLStore`` creates) and the fencing sequence of the SQL store, for the dialect of the
Django connection, and run with ``IF NOT EXISTS``: a database on which ``SQLStore`` already
created its tables is *adopted* as it is, records, counters and tokens included (a table of
the same name with other columns is refused).  The source of fencing tokens is created when
missing, starting above the largest token already stored, exactly as ``create_schema()``
does: the PostgreSQL sequence ``idempotency_fencing_seq``, or on SQLite the one-row table
``idempotency_fencing`` and the two triggers that raise it.

Runs inside the initial migration (in its transaction), never at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.schema import (
    CreateIndex,
    CreateSequence,
    CreateTable,
    DropTable,
    ExecutableDDLElement,
)

from .._core.errors import ConfigurationError
from ..stores.sql.protocol import (
    DEFAULT_TABLE_PREFIX,
    UPGRADABLE,
    build_metadata,
    fencing_sequence,
    fencing_table,
)
from ..stores.sql.protocol import upgrade_schema as sql_upgrade_schema

#: The tables' prefix: the migrations create the SQL store's default tables.
PREFIX: Final = DEFAULT_TABLE_PREFIX
SUPPORTED_VENDORS: Final = ("postgresql", "sqlite")
_RELKIND_SQL: Final = "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)"


def sa_dialect(vendor: str) -> sa.Dialect:
    """SQLAlchemy's dialect for a Django vendor (compiling only: it never connects)."""
    if vendor == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.dialect()  # type: ignore[no-untyped-call]
    if vendor == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect()
    raise ConfigurationError(
        f"idempotent_tasks.django supports PostgreSQL and SQLite databases, not {vendor!r}"
    )


def _tables(vendor: str) -> list[sa.Table]:
    tables = list(build_metadata(PREFIX).sorted_tables)
    if vendor == "sqlite":
        tables.append(fencing_table(PREFIX))
    return tables


def _ddl(element: ExecutableDDLElement, dialect: sa.Dialect) -> str:
    return str(element.compile(dialect=dialect))


def create_schema(connection: Any) -> None:
    """Create what is missing on ``connection`` (a Django ``DatabaseWrapper``); adopt what
    ``SQLStore`` created; refuse a same-named table with other columns."""
    vendor = connection.vendor
    dialect = sa_dialect(vendor)
    tables = _tables(vendor)
    quote = dialect.identifier_preparer.quote
    records = quote(f"{PREFIX}_records")
    with connection.cursor() as cursor:
        existing = set(connection.introspection.table_names(cursor))
        for table in tables:
            if table.name in existing:
                _refuse_mismatch(connection, cursor, table)
        for table in tables:
            cursor.execute(_ddl(CreateTable(table, if_not_exists=True), dialect))
            for index in sorted(table.indexes, key=lambda i: str(i.name)):
                cursor.execute(_ddl(CreateIndex(index, if_not_exists=True), dialect))
        if vendor == "postgresql":
            _create_sequence(cursor, dialect, records)
        else:
            fencing = f"{PREFIX}_fencing"
            _create_fencing(cursor, quote, records, seed=fencing not in existing)


def drop_schema(connection: Any) -> None:
    """The initial migration's reverse: drop the tables and the token source."""
    vendor = connection.vendor
    dialect = sa_dialect(vendor)
    with connection.cursor() as cursor:
        for table in reversed(_tables(vendor)):
            cursor.execute(_ddl(DropTable(table, if_exists=True), dialect))
        if vendor == "postgresql" and _relkind(cursor, dialect) == "S":
            cursor.execute(f"DROP SEQUENCE {_sequence_name(dialect)}")


def upgrade_schema(connection: Any) -> None:
    """Bring tables made by an earlier release up to date in place (the counters' ``steps``
    column, the status check admitting UNCERTAIN), as ``SQLStore.create_schema()`` does;
    then create what the upgrade dropped with a rebuilt table (SQLite's indexes and token
    triggers).  Runs inside the migration's transaction."""
    vendor = connection.vendor
    with connection.cursor() as cursor:

        def run(sql: str) -> Sequence[Sequence[Any]]:
            cursor.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []

        sql_upgrade_schema(run, sa_dialect(vendor), build_metadata(PREFIX), PREFIX)
    create_schema(connection)


def _refuse_mismatch(connection: Any, cursor: Any, table: sa.Table) -> None:
    found = [c.name for c in connection.introspection.get_table_description(cursor, table.name)]
    wanted = [c.name for c in table.columns]
    # A column an earlier release's table lacks is added by the upgrade migration.
    problems = [f"missing column {n!r}" for n in wanted if n not in found and n not in UPGRADABLE]
    problems += [f"unexpected column {n!r}" for n in found if n not in wanted]
    constraints = connection.introspection.get_constraints(cursor, table.name).values()
    pk: list[str] = next((c["columns"] for c in constraints if c.get("primary_key")), [])
    expected_pk = [c.name for c in table.primary_key.columns]
    if not problems and sorted(pk) != sorted(expected_pk):
        problems.append(f"primary key is {pk}, expected {expected_pk}")
    if problems:
        raise ConfigurationError(
            f"table {table.name!r} exists but does not match the idempotent_tasks schema: "
            f"{'; '.join(problems)}. Migrate or drop that table."
        )


def _sequence_name(dialect: sa.Dialect) -> str:
    return dialect.identifier_preparer.format_sequence(fencing_sequence(PREFIX))


def _relkind(cursor: Any, dialect: sa.Dialect) -> str | None:
    cursor.execute(_RELKIND_SQL, [_sequence_name(dialect)])
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def _create_sequence(cursor: Any, dialect: sa.Dialect, records: str) -> None:
    """The PostgreSQL sequence, if missing, starting above every stored token."""
    kind = _relkind(cursor, dialect)
    if kind is not None:
        if kind != "S":
            raise ConfigurationError(
                f"{_sequence_name(dialect)!r} exists but is not a sequence: drop that relation"
            )
        return
    cursor.execute(f"SELECT max(fencing_token) FROM {records}")
    highest = cursor.fetchone()[0]
    start = max(int(highest or 0), 0) + 1
    cursor.execute(_ddl(CreateSequence(fencing_sequence(PREFIX, start=start)), dialect))


def _create_fencing(cursor: Any, quote: Any, records: str, *, seed: bool) -> None:
    """SQLite's fencing row (seeded above every stored token when the table is new) and the
    triggers that raise it to every token written, as ``SQLStore.create_schema()`` makes
    them."""
    fencing = quote(f"{PREFIX}_fencing")
    if seed:
        cursor.execute(
            f"INSERT INTO {fencing} (id, last_token) "
            f"SELECT 1, max(coalesce(max(fencing_token), 0), 0) FROM {records}"
        )
    raise_to_new = (
        f"BEGIN UPDATE {fencing} SET last_token = NEW.fencing_token "
        "WHERE last_token < NEW.fencing_token; END"
    )
    for name, event in (("insert", "INSERT"), ("update", "UPDATE OF fencing_token")):
        trigger = quote(f"{PREFIX}_records_fencing_{name}")
        cursor.execute(
            f"CREATE TRIGGER IF NOT EXISTS {trigger} AFTER {event} ON {records} "
            f"FOR EACH ROW {raise_to_new}"
        )


__all__ = [
    "PREFIX", "SUPPORTED_VENDORS", "create_schema", "drop_schema", "sa_dialect", "upgrade_schema",
]
