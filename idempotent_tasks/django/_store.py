"""``DjangoStore``: the SQL store's primitives on Django's own database connection.

* Guarantee: the store contract (``idempotent_tasks.stores.base``), every primitive atomic in
  the database, with the *same statements* as ``SQLStore`` (its PostgreSQL and SQLite
  dialect classes are reused as they are) on the *same tables*, created by the app's
  migrations: ``SQLStore`` and ``DjangoStore`` may share one database, and
  ``idempotent-tasks --store <url> inspect …`` works on the records Django writes.
* Connection: ``django.db.connections[using]`` — the calling thread's connection, opened and
  closed by Django (``CONN_MAX_AGE``, ``CONN_HEALTH_CHECKS``); statements run through Django's
  cursor, so they show in ``connection.queries`` and the debug toolbar.  A connection whose
  call failed is closed when it is no longer usable, so the next call reconnects.
* Transactions: every write commits on its own (autocommit; SQLite's read-then-write
  primitives under ``BEGIN IMMEDIATE``), which is why a write inside someone else's
  ``transaction.atomic()`` is refused (``CONFIGURATION_ERROR``): a claim made there would
  commit or roll back with that transaction.  ``transactional=True`` bodies run in
  :meth:`DjangoStore.body_transaction` instead — ``transaction.atomic(using=…)`` holding the
  conditional SUCCESS update (see :mod:`._body`).
* Fencing tokens, TTL, timestamps: exactly as ``SQLStore`` (the PostgreSQL sequence
  ``idempotency_fencing_seq``; SQLite's ``idempotency_fencing`` row and triggers).
* Failures: tables that were never migrated raise :class:`~idempotent_tasks.ConfigurationError`
  ("run ``python manage.py migrate``"); every other database error becomes
  :class:`~idempotent_tasks.StoreUnavailableError`.  Statement timeouts are Django's:
  set them in ``DATABASES[…]["OPTIONS"]`` (e.g. PostgreSQL's ``options: "-c
  statement_timeout=30s"``).
* Databases: PostgreSQL (psycopg 3 or psycopg2) and SQLite (a file: an in-memory database is
  private to one connection).  The constructor never connects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DjangoDatabaseError
from django.db.utils import ConnectionDoesNotExist

from .._core.errors import ConfigurationError, IdempotencyError, StoreUnavailableError
from ..stores.base import BodyTransaction
from ..stores.sql import SQLStore
from ..stores.sql.protocol import Plan, dialect_plans, drive, schema_missing
from ._schema import PREFIX, SUPPORTED_VENDORS, sa_dialect

SCHEMA_MISSING: Final = (
    "schema not created: run `python manage.py migrate` (the idempotent_tasks.django app's "
    "migrations)"
)
#: The primitives that only read: allowed inside a caller's ``transaction.atomic()``.
_READS: Final = frozenset({"get", "get_retry_count", "find_stuck", "list_records", "stats"})

_T = TypeVar("_T")


class DjangoStore(SQLStore):
    """The durable store on ``django.db.connections[using]`` (see the module docstring).

    The primitives are ``SQLStore``'s own methods; this class only replaces where their
    statements run (Django's connection instead of SQLAlchemy's pool).
    """

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        # SQLStore's constructor builds an engine and a pool: none of that is used here.
        self.using = using
        self.table_prefix = PREFIX
        vendor = _vendor(using)
        self.name = vendor
        self._pg = vendor == "postgresql"
        quote = sa_dialect(vendor).identifier_preparer.quote
        self._records = quote(f"{PREFIX}_records")
        self._plans = dialect_plans(vendor, quote, PREFIX)
        self._common = self._plans.common

    def __repr__(self) -> str:
        return f"DjangoStore(using={self.using!r})"

    @property
    def engine(self) -> Any:
        """DjangoStore has no SQLAlchemy engine: it runs on Django's connection."""
        raise AttributeError(
            f"DjangoStore has no SQLAlchemy engine: it uses django.db.connections[{self.using!r}]"
        )

    @property
    def connection(self) -> Any:
        """The calling thread's Django connection (``django.db.connections[using]``)."""
        return connections[self.using]

    # -- running statements -------------------------------------------------------------------
    def _execute(self, what: str, plan: Plan[_T]) -> _T:
        """Run a primitive's plan on the thread's connection in autocommit (its cursor drives
        the plan); translate errors."""
        conn = connections[self.using]
        if conn.in_atomic_block and what not in _READS:
            raise ConfigurationError(
                f"DjangoStore.{what} inside transaction.atomic(using={self.using!r}): the "
                "idempotency record must commit on its own, so call the handler outside the "
                "atomic block (transactional bodies: transactional=True)"
            )
        try:
            with conn.cursor() as cursor:
                return drive(cursor, plan)
        except DjangoDatabaseError as exc:
            self._after_failure(conn)
            raise self.failure(what, exc) from exc
        except BaseException:
            self._after_failure(conn)
            raise

    def failure(self, what: str, exc: BaseException) -> IdempotencyError:
        """The library's error for a Django database error raised by ``what``."""
        cause = exc.__cause__ or exc  # Django wraps the driver's error
        detail = f"{type(cause).__name__}: {cause}".strip()
        where = f"{self.name} database {self.using!r}: {what} failed: {detail}"
        if schema_missing(cause):
            return ConfigurationError(f"{SCHEMA_MISSING}; {where}")
        return StoreUnavailableError(f"django store on {where}")

    def _after_failure(self, conn: Any) -> None:
        """Leave the connection usable: roll back a ``BEGIN IMMEDIATE`` a failed SQLite
        primitive left open, and close a connection that no longer works."""
        if conn.in_atomic_block:
            return  # the caller's transaction: Django's atomic block handles it
        with contextlib.suppress(Exception):
            raw = conn.connection
            if raw is not None and not self._pg and raw.in_transaction:
                raw.rollback()
        with contextlib.suppress(Exception):
            conn.close_if_unusable_or_obsolete()

    # -- schema -------------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Apply the app's migrations to this database (``manage.py migrate
        idempotent_tasks --database <using>``); idempotent."""
        from django.core.management import call_command
        from django.core.management.base import CommandError

        try:
            call_command("migrate", "idempotent_tasks", database=self.using, verbosity=0)
        except CommandError as exc:
            raise ConfigurationError(
                f"cannot migrate the idempotent_tasks app ({exc}): add "
                "'idempotent_tasks.django' to INSTALLED_APPS"
            ) from exc

    def drop_schema(self) -> None:
        """Unapply the app's migrations (drops the tables and every record in them)."""
        from django.core.management import call_command

        call_command("migrate", "idempotent_tasks", "zero", database=self.using, verbosity=0)

    def close(self) -> None:
        """Nothing to do: Django owns and closes its connections."""

    # -- transactional bodies -----------------------------------------------------------------
    @contextlib.contextmanager
    def body_transaction(self) -> Iterator[BodyTransaction]:
        """``transaction.atomic(using=…)`` entered, for one ``transactional=True`` body; left
        by ``commit``/``rollback``, and rolled back on exit if neither ran."""
        from ._body import DjangoBodyTransaction

        tx = DjangoBodyTransaction.begin(self)
        try:
            yield tx
        finally:
            tx.close()


def _vendor(using: str) -> str:
    """The vendor of the alias, read from settings (no connection is opened)."""
    try:
        vendor = str(connections[using].vendor)
    except (ConnectionDoesNotExist, ImproperlyConfigured, KeyError) as exc:
        raise ConfigurationError(f"DjangoStore(using={using!r}): {exc}") from exc
    if vendor not in SUPPORTED_VENDORS:
        raise ConfigurationError(
            f"DjangoStore supports PostgreSQL and SQLite, not {vendor!r} (database {using!r})"
        )
    return vendor


__all__ = ["SCHEMA_MISSING", "DjangoStore"]
