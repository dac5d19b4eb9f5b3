"""SQLStore on MySQL / MariaDB: the schema in MySQL's types, its creation, and the
per-connection settings (see ``_mysql.py`` for why each one)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any, Final

import sqlalchemy as sa

from ..._core.errors import ConfigurationError
from ._mysql import SCOPE_BYTES
from ._schema import DEFAULT_TABLE_PREFIX, build_metadata, create_missing_indexes, refuse_mismatch
from ._upgrade import UPGRADABLE, sa_runner, upgrade_schema

_VAR_STRING: Final = 253  # pymysql.constants.FIELD_TYPE.VAR_STRING (VARBINARY columns)
_IN_TRANS: Final = 1  # pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS
_FOUND_ROWS: Final = 2  # pymysql.constants.CLIENT.FOUND_ROWS
#: Seconds ``create_schema`` waits for a concurrent one (``GET_LOCK``).
_SCHEMA_LOCK_WAIT: Final = 30


# -- schema -----------------------------------------------------------------------------------
def mysql_metadata(prefix: str = DEFAULT_TABLE_PREFIX) -> sa.MetaData:
    """The three tables of :func:`build_metadata` in MySQL's types: byte-exact VARBINARY scope
    columns, a LONGBLOB response, utf8mb4 InnoDB tables, an index on the fencing token (the
    ``AUTO_INCREMENT`` column must be indexed) and, for recovery, ``(status, updated_at)``
    instead of PostgreSQL's partial index (InnoDB has none; the primary key columns that
    every secondary index carries give the full ``ORDER BY``)."""
    md = build_metadata(prefix)
    for table in md.tables.values():
        table.dialect_kwargs["mysql_engine"] = "InnoDB"
        table.dialect_kwargs["mysql_charset"] = "utf8mb4"
        for column in table.primary_key.columns:
            column.type = sa.VARBINARY(SCOPE_BYTES)
    records = md.tables[f"{prefix}_records"]
    records.c.response.type = sa.dialects.mysql.LONGBLOB()
    md.tables[f"{prefix}_retry_counters"].c.steps.type = sa.dialects.mysql.LONGBLOB()
    for index in list(records.indexes):
        if index.name == f"{prefix}_records_processing_idx":
            records.indexes.discard(index)
    sa.Index(f"{prefix}_records_status_idx", records.c.status, records.c.updated_at)
    sa.Index(f"{prefix}_records_fencing_idx", records.c.fencing_token)
    return md


def _auto_increment(records: str) -> str:
    return f"ALTER TABLE {records} MODIFY fencing_token BIGINT NOT NULL AUTO_INCREMENT"


def create_schema(
    conn: sa.Connection, metadata: sa.MetaData, prefix: str, records: str,
    extend: Callable[[], None] = lambda: None,
) -> None:
    """Create what is missing, under a named lock (MySQL commits DDL at once, so the lock —
    not a transaction — serialises concurrent calls); the token column becomes
    ``AUTO_INCREMENT`` where it is not yet.  ``extend`` (the registered extensions' tables)
    runs under the same lock."""
    lock = f"idempotent_tasks:{prefix}"
    got = conn.exec_driver_sql("SELECT GET_LOCK(%s, %s)", (lock, _SCHEMA_LOCK_WAIT)).scalar()
    if got != 1:
        raise ConfigurationError(f"create_schema: another one held {lock!r} for too long")
    try:
        inspector = sa.inspect(conn)
        for table in metadata.sorted_tables:
            if inspector.has_table(table.name):
                refuse_mismatch(table, inspector, UPGRADABLE)
        upgrade_schema(sa_runner(conn), conn.dialect, metadata, prefix)
        metadata.create_all(conn, checkfirst=True)
        create_missing_indexes(conn, metadata)
        extra = conn.exec_driver_sql(
            "SELECT extra FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = %s AND column_name = 'fencing_token'",
            (f"{prefix}_records",),
        ).scalar()
        if "auto_increment" not in str(extra).lower():
            conn.exec_driver_sql(_auto_increment(records))
        extend()
    finally:
        conn.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (lock,))


def mysql_ddl(prefix: str = DEFAULT_TABLE_PREFIX) -> str:
    """The DDL ``create_schema()`` emits on a fresh MySQL/MariaDB database, as one script."""
    from sqlalchemy.dialects import mysql
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = mysql.dialect()
    metadata = mysql_metadata(prefix)
    blocks = []
    for name in ("records", "retry_counters", "locks"):
        table = metadata.tables[f"{prefix}_{name}"]
        statements = [str(CreateTable(table).compile(dialect=dialect))] + [
            str(CreateIndex(i).compile(dialect=dialect))
            for i in sorted(table.indexes, key=lambda i: str(i.name))
        ]
        blocks.append(";\n".join(_tidy(s) for s in statements))
    blocks.append(_auto_increment(f"{prefix}_records"))
    return ";\n\n".join(blocks) + ";"


def _tidy(ddl: str) -> str:
    lines = (line.rstrip().replace("\t", "    ") for line in ddl.strip().splitlines())
    return "\n".join(line for line in lines if line)


# -- connections ------------------------------------------------------------------------------
def _text(value: Any) -> Any:
    """Scope columns are VARBINARY: hand them back as the strings they were written as."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else value


@cache
def _chain_cursor() -> type[Any]:
    """PyMySQL's cursor, but ``execute`` returns the cursor (as psycopg's and sqlite3's do),
    so the statements shared by every dialect can chain ``.fetchall()``."""
    import pymysql.cursors

    class ChainCursor(pymysql.cursors.Cursor):
        def execute(self, query: Any, args: Any = None) -> Any:
            super().execute(query, args)
            return self

    return ChainCursor


def make_adopt(
    engine: sa.Engine,
) -> tuple[Callable[[Any, dict[Any, Any]], Any], Callable[[Any, Any], None]]:
    """Per-connection settings for the store's own statements (autocommit, ``READ
    COMMITTED``, VARBINARY decoded), and the function that restores what was there."""
    dialect: Any = engine.dialect

    def adopt(dbapi: Any, info: dict[Any, Any]) -> Any:
        if not dbapi.client_flag & _FOUND_ROWS:
            raise ConfigurationError(
                "SQLStore on MySQL needs CLIENT.FOUND_ROWS (SQLAlchemy's PyMySQL dialect sets "
                "it; do not override client_flag)"
            )
        saved = (dbapi.get_autocommit(), dbapi.decoders.get(_VAR_STRING),
                 dialect.get_isolation_level(dbapi), dbapi.cursorclass)
        if saved[2] != "READ COMMITTED":
            dialect.set_isolation_level(dbapi, "READ COMMITTED")
        dbapi.autocommit(True)
        dbapi.decoders[_VAR_STRING] = _text
        dbapi.cursorclass = _chain_cursor()
        return saved

    def restore(dbapi: Any, saved: Any) -> None:
        autocommit, decoder, isolation, cursorclass = saved
        dbapi.cursorclass = cursorclass
        dbapi.decoders[_VAR_STRING] = decoder
        dbapi.autocommit(autocommit)
        if isolation != "READ COMMITTED":
            dialect.set_isolation_level(dbapi, isolation)

    return adopt, restore


def begin_body(conn: sa.Connection) -> tuple[Any, Callable[[], bool]]:
    """Begin the body's transaction now (not at the body's first statement), so that a body
    which sends ``COMMIT`` itself leaves the session outside a transaction and is caught."""
    dbapi: Any = conn.connection.driver_connection
    trans = conn.begin()
    conn.exec_driver_sql("BEGIN")
    return trans, lambda: bool(dbapi.server_status & _IN_TRANS)


def connect_args(timeout: float, socket_timeout: float | None) -> dict[str, Any]:
    """PyMySQL's connect arguments; its socket timeouts give every call a deadline, so a
    call on a link that went silent fails closed instead of hanging."""
    args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(timeout)), "charset": "utf8mb4"}
    if socket_timeout:
        args["read_timeout"] = args["write_timeout"] = max(1, math.ceil(socket_timeout))
    return args


def bound_handshake(engine: sa.Engine) -> None:
    """Make ``engine``'s connections wait at most ``connect_timeout`` for the server's
    handshake too: PyMySQL bounds only the TCP connect by it and reads the greeting and the
    authentication replies with the read timeout (30 s by default, none without one), so a
    server that accepts and never answers would hold the first call that long."""
    connection_class = _handshake_bounded()

    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return connection_class(*cargs, **cparams)

    sa.event.listen(engine, "do_connect", connect)


@cache
def _handshake_bounded() -> type[Any]:
    from pymysql.connections import Connection

    class HandshakeBoundedConnection(Connection):
        """PyMySQL's connection, its handshake read and written under ``connect_timeout``."""

        _read_timeout: float | None
        _write_timeout: float | None

        def connect(self, sock: Any = None) -> None:
            timeouts = self._read_timeout, self._write_timeout
            self._read_timeout = self._write_timeout = self.connect_timeout
            try:
                super().connect(sock)
            finally:
                self._read_timeout, self._write_timeout = timeouts

    return HandshakeBoundedConnection
