"""SQLStore's error translation at the store boundary.

A database without the store's tables (or sequence), and credentials the server refuses (a
wrong password or user), are configuration errors: retrying would never help, so they raise
:class:`ConfigurationError`, naming the fix or carrying the server's own reason.  Every other
driver or pool error is an outage, :class:`StoreUnavailableError` (fail closed).
"""

from __future__ import annotations

import re
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
#: SQLSTATE class 28, invalid authorization (asyncpg: ``InvalidPasswordError`` is 28P01).
_AUTH_SQLSTATE_CLASS: Final = "28"
#: What libpq says when the server refuses the credentials: psycopg's connection errors carry
#: no SQLSTATE, only this text.
_LIBPQ_AUTH: Final = re.compile(
    r"authentication failed|no password supplied|pg_hba\.conf rejects|no pg_hba\.conf entry"
)
#: MySQL/MariaDB: ER_DBACCESS_DENIED_ERROR, ER_ACCESS_DENIED_ERROR,
#: ER_ACCESS_DENIED_NO_PASSWORD_ERROR.
_MYSQL_AUTH_CODES: Final = frozenset({1044, 1045, 1698})


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


def auth_failed(exc: BaseException) -> bool:
    """Does ``exc`` (a DBAPI or asyncpg error, or SQLAlchemy's wrapper of one) say that the
    server refused the credentials?"""
    cause = getattr(exc, "orig", None) or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_AUTH_SQLSTATE_CLASS):
        return True
    module = type(cause).__module__
    if module.startswith("pymysql"):
        return bool(cause.args) and cause.args[0] in _MYSQL_AUTH_CODES
    return module.startswith("psycopg") and bool(_LIBPQ_AUTH.search(str(cause)))


def translate(store: str, prefix: str, what: str, exc: BaseException) -> IdempotencyError:
    """The library's error for a driver error raised by ``what``."""
    detail = f"{type(exc).__name__}: {exc}".strip()
    if auth_failed(exc):
        return ConfigurationError(
            f"{store} store: {what} failed: the server refused the credentials (check the "
            f"URL's user and password): {detail}"
        )
    if schema_missing(exc):
        return ConfigurationError(
            f"{SCHEMA_MISSING}; {store} store with table_prefix {prefix!r}: {what} failed: "
            f"{detail}"
        )
    return StoreUnavailableError(f"{store} store: {what} failed: {detail}")
