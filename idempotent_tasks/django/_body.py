"""The transaction of a ``transactional=True`` body on a ``DjangoStore``.

The engine claims the scope first (its own autocommit statement, committed), then opens this
transaction: ``transaction.atomic(using=…)``, entered here and left by :meth:`commit` or
:meth:`rollback`.  The body gets ``django.db.connections[using]`` and writes through the ORM as
usual (its writes join the atomic block; its own ``atomic()`` blocks become savepoints); the
engine then runs the conditional SUCCESS update inside the same block and commits both.
What is guaranteed:

* the body's writes and SUCCESS commit together, or neither does (a crash, an exception, a
  lost lease, a response that cannot be stored all roll back);
* :meth:`rollback` really leaves the atomic block before the engine writes the counter, a
  release or a poison (each in its own autocommit statement): a rollback never erases a
  counted failure;
* a body that ended the transaction itself — a raw ``COMMIT``/``ROLLBACK``, a call on the
  driver's connection, ``transaction.set_rollback(True)``, or a database error it swallowed
  inside the block (Django then refuses every query until the block ends) — is detected by
  :meth:`is_intact`: the engine poisons the scope with ``CONFIGURATION_ERROR``.  (Django
  itself refuses ``transaction.commit()`` inside an atomic block: that raises in the body.)
* ``transaction.on_commit`` callbacks registered by the body (``enqueue_once`` among them) run
  after the commit; one that raises is logged (``on_commit_failed``) and does not turn a
  committed success into an error.

On SQLite the block takes the database's write lock at once (as the SQL store's ``BEGIN
IMMEDIATE`` does), so the body never fails to upgrade a read lock half-way.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final, Protocol

from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction

from .._core.errors import ConfigurationError, IdempotencyError
from .._core.logging import default_logger
from .._core.records import Scope
from ..stores.sql import protocol as q


class DjangoStore(Protocol):
    """What a body transaction needs of its ``DjangoStore`` (``._store``)."""

    using: str
    _pg: bool
    _records: str
    _common: Any

    def failure(self, what: str, exc: BaseException) -> IdempotencyError: ...

_PG_IN_TRANSACTION: Final = 2  # psycopg / psycopg2 TransactionStatus.INTRANS
_log = default_logger()


class DjangoBodyTransaction:
    """One open ``transaction.atomic(using=…)`` for a body (see the module docstring)."""

    def __init__(self, store: DjangoStore, connection: Any, atomic: Any) -> None:
        #: What the body receives: ``django.db.connections[using]``.
        self.connection = connection
        self._store = store
        self._atomic = atomic
        self._open = True
        self._committed = False

    @classmethod
    def begin(cls, store: DjangoStore) -> DjangoBodyTransaction:
        conn = connections[store.using]
        if conn.in_atomic_block:
            raise ConfigurationError(
                f"a transactional body cannot run inside transaction.atomic(using="
                f"{store.using!r}): its claim must commit first, on its own"
            )
        atomic = transaction.atomic(using=store.using)
        try:
            atomic.__enter__()
        except DjangoDatabaseError as exc:
            raise store.failure("body_transaction", exc) from exc
        tx = cls(store, conn, atomic)
        transaction.on_commit(tx._mark_committed, using=store.using)
        try:
            with conn.cursor() as cursor:
                # Open the server transaction now (psycopg begins lazily), so that a body
                # ending it leaves the driver idle; on SQLite, take the write lock now.
                cursor.execute(
                    "SELECT 1" if store._pg
                    else f"UPDATE {store._records} SET updated_at = updated_at WHERE 0 = 1"
                )
        except DjangoDatabaseError as exc:
            tx.close()
            raise store.failure("body_transaction", exc) from exc
        return tx

    def _mark_committed(self) -> None:
        self._committed = True  # the first on_commit callback: the commit itself succeeded

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """Conditional on PROCESSING + our token, inside the body's atomic block; refused
        when the block is no longer the one the body got."""
        if not self.is_intact():
            raise ConfigurationError(
                "the body committed or rolled back the idempotency transaction itself",
                tenant=scope.tenant, operation=scope.operation, key=scope.key,
            )
        params = q.scope_params(scope)
        params.update(token=token, response=response, now=now, expires_at=expires_at)
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(self._store._common.mark_success, params)
                return int(cursor.rowcount) == 1
        except DjangoDatabaseError as exc:
            raise self._store.failure("mark_success", exc) from exc

    def is_intact(self) -> bool:
        """Our atomic block is still the only one open, not marked for rollback, and the
        database transaction it began is still open."""
        conn = self.connection
        if not (
            self._open and conn.in_atomic_block and conn.atomic_blocks == [self._atomic]
            and not conn.needs_rollback and not conn.get_autocommit()
        ):
            return False
        raw = conn.connection
        if raw is None:
            return False
        if self._store._pg:
            return bool(raw.info.transaction_status == _PG_IN_TRANSACTION)
        return bool(raw.in_transaction)

    def commit(self) -> None:
        """Leave the atomic block, committing; a failed commit is ``STORE_UNAVAILABLE``
        (the engine reports ``OUTCOME_NOT_RECORDED``: the lease decides)."""
        self._open = False
        try:
            self._atomic.__exit__(None, None, None)
        except Exception as exc:
            if not self._committed:
                if isinstance(exc, DjangoDatabaseError):
                    raise self._store.failure("commit", exc) from exc
                raise
            _log.error("on_commit_failed", database=self._store.using, error=repr(exc))

    def rollback(self) -> None:
        """Leave the atomic block, rolling back.  A connection that failed is dropped: the
        server rolls back the transaction of a connection that is gone."""
        if not self._open:
            return
        self._open = False
        try:
            transaction.set_rollback(True, using=self._store.using)
            self._atomic.__exit__(None, None, None)
        except DjangoDatabaseError:
            with contextlib.suppress(Exception):
                self.connection.close()

    def close(self) -> None:
        """Roll back if still open (the body transaction's context manager exit)."""
        self.rollback()


__all__ = ["DjangoBodyTransaction"]
