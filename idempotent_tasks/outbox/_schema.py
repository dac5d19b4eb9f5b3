"""The outbox tables: ``<prefix>_outbox`` (staged rows waiting to be published, or POISONED)
and ``<prefix>_outbox_sent`` (published rows, kept ``ttl``) — SQLAlchemy Core, their DDL,
creation and removal.

A staged row is written once, by the body, into ``<prefix>_outbox``; the relay moves it to
``<prefix>_outbox_sent`` once its broker confirmed it.  So the table every body writes holds
only what is in flight: its one index is the primary key (``id``, an identity /
``AUTOINCREMENT`` column, so the rows of one transaction get increasing ids in the order
they were staged), which is also the relay's scan order; a body's ``INSERT`` maintains
nothing else.  The parent scope ``(tenant, operation, parent_key)`` is the ordering domain;
``parent_token`` is the fencing token of the attempt that staged the row (only the committed
attempt's rows exist).  ``<prefix>_outbox_sent`` is indexed on ``expires_at`` for the
clean-up.  On MySQL / MariaDB the scope columns are byte-exact ``VARBINARY`` like the store's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ..stores.sql.protocol import (
    DEFAULT_TABLE_PREFIX,
    refuse_mismatch,
    register_schema_extension,
)

#: The tables' names: the store's table prefix plus these suffixes.
TABLE_SUFFIX: Final = "_outbox"
SENT_SUFFIX: Final = "_outbox_sent"
_SCOPE_BYTES: Final = 1020  # 255 characters of UTF-8, as the store's MySQL scope columns


class RowStatus(StrEnum):
    """A staged row's state: waiting to be published, published, or left for the operator."""

    PENDING = "PENDING"
    SENT = "SENT"
    POISONED = "POISONED"


def table_name(prefix: str = DEFAULT_TABLE_PREFIX) -> str:
    return f"{prefix}{TABLE_SUFFIX}"


def sent_table_name(prefix: str = DEFAULT_TABLE_PREFIX) -> str:
    return f"{prefix}{SENT_SUFFIX}"


def _text() -> sa.types.TypeEngine[str]:
    return (
        sa.Text()
        .with_variant(sa.Text(collation="C"), "postgresql")
        .with_variant(sa.VARBINARY(_SCOPE_BYTES), "mysql", "mariadb")
    )


def outbox_table(prefix: str = DEFAULT_TABLE_PREFIX, metadata: sa.MetaData | None = None
                 ) -> sa.Table:
    """``<prefix>_outbox``: the rows waiting to be published (and POISONED ones)."""
    return _table(table_name(prefix), metadata, sent=False)


def sent_table(prefix: str = DEFAULT_TABLE_PREFIX, metadata: sa.MetaData | None = None
               ) -> sa.Table:
    """``<prefix>_outbox_sent``: published rows, until their ``expires_at``."""
    return _table(sent_table_name(prefix), metadata, sent=True)


def _blob() -> sa.types.TypeEngine[bytes]:
    return sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")


def _table(name: str, metadata: sa.MetaData | None, *, sent: bool) -> sa.Table:
    statuses = "'SENT'" if sent else "'PENDING', 'POISONED'"
    extra: list[Any] = [sa.Index(f"{name}_expires_idx", "expires_at")] if sent else []
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=not sent),
        sa.Column("tenant", _text(), nullable=False),
        sa.Column("operation", _text(), nullable=False),
        sa.Column("parent_key", _text(), nullable=False),
        sa.Column("parent_token", sa.BigInteger(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("message", _blob(), nullable=False),
        sa.Column("body", _blob(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("available_at", sa.Double(), nullable=False),
        sa.Column("sent_at", sa.Double(), nullable=True),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=f"{name}_pkey"),
        sa.CheckConstraint(f"status IN ({statuses})", name=f"{name}_status_ck"),
        *extra,
        # ids are never reused, even after the newest row moved on
        sqlite_autoincrement=not sent,
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def _lock(conn: sa.Connection, prefix: str) -> None:
    """Serialise concurrent ``create_schema`` / ``drop_schema`` calls on PostgreSQL (two
    concurrent ``CREATE TABLE IF NOT EXISTS`` can both try to create the type)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "SELECT pg_advisory_xact_lock(hashtext(%(p)s))", {"p": table_name(prefix)}
        )


def create_schema(conn: sa.Connection, prefix: str = DEFAULT_TABLE_PREFIX) -> None:
    """Create the tables and their indexes where missing, on ``conn`` (inside the caller's
    transaction).  A same-named table with other columns is refused
    (:class:`~idempotent_tasks.ConfigurationError`)."""
    _lock(conn, prefix)
    inspector = sa.inspect(conn)
    for table in (outbox_table(prefix), sent_table(prefix)):
        if not inspector.has_table(table.name):
            table.create(conn)
            continue
        refuse_mismatch(table, inspector)
        present = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:
                index.create(conn)


def drop_schema(conn: sa.Connection, prefix: str = DEFAULT_TABLE_PREFIX) -> None:
    _lock(conn, prefix)
    for table in (outbox_table(prefix), sent_table(prefix)):
        table.drop(conn, checkfirst=True)


# ``SQLStore.create_schema()`` / ``drop_schema()`` (and ``idempotent-tasks migrate``) create
# and drop the outbox's tables with the store's, in the same transaction.
register_schema_extension("outbox", create_schema, drop_schema)


def ddl(dialect_name: str, prefix: str = DEFAULT_TABLE_PREFIX, *, if_not_exists: bool = False
        ) -> list[str]:
    """The statements ``create_schema()`` runs on a fresh database of ``dialect_name``
    (``"postgresql"``, ``"sqlite"`` or ``"mysql"``), for the docs and the Django migration
    (which runs them ``if_not_exists``: a table ``SQLStore`` created is adopted as it is)."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = _dialect(dialect_name)
    statements: list[Any] = []
    for table in (outbox_table(prefix), sent_table(prefix)):
        statements.append(CreateTable(table, if_not_exists=if_not_exists))
        statements += [CreateIndex(i, if_not_exists=if_not_exists)
                       for i in sorted(table.indexes, key=lambda i: str(i.name))]
    return [str(s.compile(dialect=dialect)).strip() for s in statements]


def _dialect(name: str) -> sa.Dialect:
    if name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.dialect()  # type: ignore[no-untyped-call]
    if name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect()
    if name in ("mysql", "mariadb"):
        return mysql.dialect()
    raise ValueError(f"no outbox DDL for {name!r}")


__all__ = [
    "SENT_SUFFIX",
    "TABLE_SUFFIX",
    "RowStatus",
    "create_schema",
    "ddl",
    "drop_schema",
    "outbox_table",
    "sent_table",
    "sent_table_name",
    "table_name",
]
