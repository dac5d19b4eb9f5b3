"""AsyncSQLStore's body transactions: ``run_async(transactional=True)``.

The body gets the driver's connection (a ``psycopg.AsyncConnection``, or an asyncpg
connection) with a transaction begun (``BEGIN`` on an autocommit connection, so the server
transaction is open before the body runs); the conditional SUCCESS update (the protocol's
``mark_success`` plan) runs inside it and both commit together, exactly like
``SQLStore.body_transaction`` on the sync path.  A body that commits or rolls back the
transaction itself leaves the connection idle: ``is_intact`` sees it and the engine poisons
the scope.  The library's own statements here run under the store's deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ..._core.records import Scope
from ..sql.protocol import check_intact
from ._plumbing import AsyncSQLPlumbing
from ._transports import Held

_T = TypeVar("_T")


class AsyncSQLBodyTransaction:
    """One open transaction for a transactional coroutine body."""

    def __init__(self, store: AsyncSQLTransactions, held: Held) -> None:
        #: What the body receives: the driver's connection inside the transaction.
        self.connection = held.conn
        self._held = held
        self._store = store
        self.finished = False

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        """Conditional on PROCESSING + our token (see ``SQLStore.body_transaction``)."""
        check_intact(self.is_intact(), scope)
        store = self._store
        plan = store._plans.mark_success(
            scope, token=token, response=response, now=now, expires_at=expires_at
        )
        done: bool = await store._guarded(
            "mark_success", self._held, lambda: store._transport.run(self._held, plan)
        )
        return done

    def is_intact(self) -> bool:
        return not self.finished and self._store._transport.in_transaction(self.connection)

    async def commit(self) -> None:
        await self._store._command("commit", self._held, "COMMIT")
        self.finished = True

    async def rollback(self) -> None:
        if self._store._transport.in_transaction(self.connection):
            await self._store._command("rollback", self._held, "ROLLBACK")
        self.finished = True


class AsyncSQLTransactions(AsyncSQLPlumbing):
    """AsyncSQLStore's body transactions (see the module docstring)."""

    @contextlib.asynccontextmanager
    async def body_transaction(self) -> AsyncIterator[AsyncSQLBodyTransaction]:
        """A connection with a transaction begun; rolled back unless committed; the
        connection always goes back to the pool (closed if its state is unknown)."""
        held = await self._acquire("body_transaction")
        tx = AsyncSQLBodyTransaction(self, held)
        intact = False
        try:
            await self._command("body_transaction", held, "BEGIN")
            yield tx
            if self._transport.in_transaction(held.conn):
                await self._command("rollback", held, "ROLLBACK")
            intact = not held.fired
        finally:
            if intact:
                self._release(held)
            else:
                await self._discard(held, lost=False)

    async def _command(self, what: str, held: Held, sql: str) -> None:
        await self._guarded(what, held, lambda: self._transport.command(held.conn, sql))

    async def _guarded(self, what: str, held: Held, step: Callable[[], Awaitable[_T]]) -> _T:
        """One of the library's statements in a body transaction: under the deadline, its
        driver errors translated."""
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.start(held)
        try:
            return await step()
        except self._errors as exc:
            raise self._failure(what, exc) from exc
        finally:
            if watchdog is not None:
                watchdog.stop(held)


__all__ = ["AsyncSQLBodyTransaction", "AsyncSQLTransactions"]
