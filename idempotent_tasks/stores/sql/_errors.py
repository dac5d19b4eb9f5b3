"""SQLStore's error translation at the store boundary.

A database without the store's tables (or sequence) is a configuration error: retrying would
never help, so it raises :class:`ConfigurationError` naming the fix.  Every other driver or
pool error is an outage, :class:`StoreUnavailableError` (fail closed).
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..._core.errors import ConfigurationError, IdempotencyError, StoreUnavailableError

SCHEMA_MISSING: Final = (
    "schema not created: run `idempotent-tasks migrate` (or store.create_schema())"
)
#: undefined_table (also a ``nextval`` of a missing sequence), undefined_object.
_UNDEFINED_SQLSTATES: Final = frozenset({"42P01", "42704"})
#: MySQL/MariaDB: ER_NO_SUCH_TABLE.
_MYSQL_UNDEFINED_ARGS: Final = frozenset({(1146,)})


def schema_missing(exc: BaseException) -> bool:
    """Does ``exc`` (a DBAPI error, or SQLAlchemy's wrapper of one) say that a table or the
    sequence does not exist?"""
    cause = getattr(exc, "orig", None) or exc  # sqlalchemy.exc.DBAPIError wraps the driver's
    if getattr(cause, "sqlstate", None) in _UNDEFINED_SQLSTATES:  # psycopg
        return True
    if type(cause).__module__.startswith("pymysql") and cause.args[:1] in _MYSQL_UNDEFINED_ARGS:
        return True
    return isinstance(cause, sqlite3.OperationalError) and str(cause).startswith(
        "no such table"
    )


def translate(store: str, prefix: str, what: str, exc: BaseException) -> IdempotencyError:
    """The library's error for a driver error raised by ``what``."""
    detail = f"{type(exc).__name__}: {exc}".strip()
    if schema_missing(exc):
        return ConfigurationError(
            f"{SCHEMA_MISSING}; {store} store with table_prefix {prefix!r}: {what} failed: "
            f"{detail}"
        )
    return StoreUnavailableError(f"{store} store: {what} failed: {detail}")
