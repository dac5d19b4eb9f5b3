"""Is an outcome committed on this PostgreSQL server safe from a failover?

With asynchronous streaming replication (PostgreSQL's default) a commit returns once the
primary has it; a standby receives it later.  A standby promoted in between never had it, so a
SUCCESS the store reported as recorded is gone and the next delivery runs the body again — a
re-run no retry counter shows.  Only *synchronous* replication closes that window: the commit
waits until a standby has the WAL (``synchronous_commit`` ``on`` — flushed there —, also
``remote_write`` or ``remote_apply``), and waits for a standby named by
``synchronous_standby_names``.  With ``synchronous_standby_names`` empty, or
``synchronous_commit`` ``off`` / ``local``, commits wait for no standby at all.

:func:`check_synchronous_replication` (psycopg) and :func:`acheck_synchronous_replication`
(psycopg async, asyncpg) read those settings, as the connection's own session sees them (so a
role's or database's ``ALTER … SET synchronous_commit`` and ``options=-c …`` in the URL count),
in one round trip, and raise :class:`~idempotent_tasks.ConfigurationError` naming the setting
to change; they write nothing and take no lock.  They check the configuration, not the present:
with a synchronous standby configured but none connected, commits *wait* (they do not get
lost), which is PostgreSQL's behaviour and passes the check.  A server in recovery (a standby)
fails it: the store needs the primary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

from ..._core.errors import ConfigurationError

if TYPE_CHECKING:
    import psycopg

#: One round trip: the session's effective settings and whether the server is a standby.
SETTINGS_QUERY: Final = (
    "SELECT current_setting('synchronous_commit'),"
    " current_setting('synchronous_standby_names'), pg_is_in_recovery()"
)
#: ``synchronous_commit`` values whose commits do not wait for any standby.
LOCAL_COMMIT_LEVELS: Final = frozenset({"off", "local"})
_IDLE: Final = 0  # psycopg's pq.TransactionStatus.IDLE (an IntEnum)


def verify_replication_settings(
    synchronous_commit: str, synchronous_standby_names: str, in_recovery: bool
) -> None:
    """Raise ``ConfigurationError`` unless commits with these settings wait for a standby."""
    if in_recovery:
        raise ConfigurationError(
            "require_synchronous_replication: this PostgreSQL server is in recovery (a "
            "standby); point the store at the primary"
        )
    if not synchronous_standby_names.strip():
        raise ConfigurationError(
            "require_synchronous_replication: synchronous_standby_names is empty on this "
            "PostgreSQL server, so commits wait for no standby and a failover can lose "
            "recorded outcomes; set synchronous_standby_names on the primary (e.g. "
            "'FIRST 1 (standby1)' or '*') and reload"
        )
    level = synchronous_commit.strip().lower()
    if level in LOCAL_COMMIT_LEVELS:
        raise ConfigurationError(
            f"require_synchronous_replication: synchronous_commit is {level!r} for this "
            "connection, so commits do not wait for the synchronous standby and a failover "
            "can lose recorded outcomes; set synchronous_commit = on (or remote_apply) for "
            "the server, database or role the store uses"
        )


def check_synchronous_replication(
    connection: psycopg.Connection[Any] | psycopg.Cursor[Any],
) -> None:
    """Raise ``ConfigurationError`` unless commits on the server behind ``connection`` (a
    psycopg connection or cursor) wait for a synchronous standby; return otherwise.

    On a connection outside autocommit with no transaction open, the transaction the query
    opens is rolled back, so the connection is left as it was found."""
    conn = _connection_of(connection)
    opened = not conn.autocommit and conn.info.transaction_status == _IDLE
    try:
        row = conn.execute(SETTINGS_QUERY).fetchone()
    finally:
        if opened:
            conn.rollback()
    assert row is not None  # a SELECT without FROM answers one row
    verify_replication_settings(str(row[0]), str(row[1]), bool(row[2]))


def _connection_of(
    connection: psycopg.Connection[Any] | psycopg.Cursor[Any],
) -> psycopg.Connection[Any]:
    if hasattr(connection, "cursor"):  # a connection (a cursor has no cursor())
        return cast("psycopg.Connection[Any]", connection)
    return connection.connection


async def acheck_synchronous_replication(connection: Any) -> None:
    """:func:`check_synchronous_replication` for ``psycopg.AsyncConnection`` or an
    ``asyncpg`` connection (whose queries always run in autocommit unless told otherwise)."""
    fetchrow = getattr(connection, "fetchrow", None)
    if fetchrow is not None:  # asyncpg
        row = await fetchrow(SETTINGS_QUERY)
    else:
        row = await _psycopg_async_row(connection)
    assert row is not None
    verify_replication_settings(str(row[0]), str(row[1]), bool(row[2]))


async def _psycopg_async_row(conn: psycopg.AsyncConnection[Any]) -> Any:
    opened = not conn.autocommit and conn.info.transaction_status == _IDLE
    try:
        cursor = await conn.execute(SETTINGS_QUERY)
        return await cursor.fetchone()
    finally:
        if opened:
            await conn.rollback()
