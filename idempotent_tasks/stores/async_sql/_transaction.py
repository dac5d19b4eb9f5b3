"""AsyncSQLStore's body transactions: ``run_async(transactional=True)``.

The body gets a ``psycopg.AsyncConnection`` with a transaction begun (``BEGIN`` on an
autocommit connection, so the server transaction is open before the body runs); the
conditional SUCCESS update runs inside it and both commit together, exactly like
``SQLStore.body_transaction`` on the sync path.  A body that commits or rolls back the
transaction itself leaves the connection idle: ``is_intact`` sees it and the engine poisons
the scope.  The library's own statements here run under the store's deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from ..._core.errors import ConfigurationError
from ..._core.records import Scope
from ..sql import _statements as q
from ._connections import _IDLE
from ._plumbing import AsyncSQLPlumbing, _Deadline

_T = TypeVar("_T")


class AsyncSQLBodyTransaction:
    """One open transaction for a transactional coroutine body."""

    def __init__(self, store: AsyncSQLTransactions, connection: Any) -> None:
        #: What the body receives: the ``psycopg.AsyncConnection`` inside the transaction.
        self.connection = connection
        self._store = store
        self.finished = False

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """Conditional on PROCESSING + our token; refuses to run outside our transaction, so
        a success can never be committed apart from the body's writes."""
        if not self.is_intact():
            raise ConfigurationError(
                "the body committed or rolled back the idempotency transaction itself",
                tenant=scope.tenant, operation=scope.operation, key=scope.key,
            )
        params = q.scope_params(scope)
        params.update(token=token, response=response, now=now, expires_at=expires_at)
        cur = await self._guarded("mark_success", self.connection.execute(
            self._store._common.mark_success, params
        ))
        return int(cur.rowcount) == 1

    def is_intact(self) -> bool:
        return not self.finished and self.connection.info.transaction_status != _IDLE

    async def commit(self) -> None:
        await self._guarded("commit", self.connection.execute("COMMIT"))
        self.finished = True

    async def rollback(self) -> None:
        if self.connection.info.transaction_status != _IDLE:
            await self._guarded("rollback", self.connection.execute("ROLLBACK"))
        self.finished = True

    async def _guarded(self, what: str, step: Awaitable[_T]) -> _T:
        return await self._store._guarded(what, self.connection, step)


class AsyncSQLTransactions(AsyncSQLPlumbing):
    """AsyncSQLStore's body transactions (see the module docstring)."""

    @contextlib.asynccontextmanager
    async def body_transaction(self) -> AsyncIterator[AsyncSQLBodyTransaction]:
        """A connection with a transaction begun; rolled back unless committed; the
        connection always goes back to the pool (closed if its state is unknown)."""
        wire = await self._acquire("body_transaction")
        wire.detach()  # psycopg's own waits drive this connection until it is released
        conn = wire.conn
        tx = AsyncSQLBodyTransaction(self, conn)
        intact = False
        try:
            await self._guarded("body_transaction", conn, conn.execute("BEGIN"))
            yield tx
            if conn.info.transaction_status != _IDLE:
                await self._guarded("rollback", conn, conn.execute("ROLLBACK"))
            intact = True
        finally:
            if intact:
                self._release(wire)  # registered with the loop again
            else:
                await self._discard(wire, lost=False)

    async def _guarded(self, what: str, conn: Any, step: Awaitable[_T]) -> _T:
        """One of the library's statements in a body transaction: under the deadline, its
        driver errors translated."""
        timeout = self._socket_timeout
        deadline = None if timeout is None else _Deadline(conn, timeout)
        try:
            return await step
        except self._errors as exc:
            raise self._failure(what, exc) from exc
        finally:
            if deadline is not None:
                deadline.handle.cancel()
