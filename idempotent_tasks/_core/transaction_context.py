"""The open transaction of the transactional body running in this thread / task.

A transactional body gets its transaction's connection as an argument; code the body calls
(the outbox's ``current_outbox().send(...)``) reaches the same connection through this
``ContextVar`` instead, so whatever it writes commits with the body's writes and its SUCCESS,
or is rolled back with them.  The flow sets it around the body (:func:`bound_to_transaction`)
and resets it when the body returns: it never outlives the transaction, never crosses to
another thread (a new thread starts with no context) and nested bodies restore the outer one.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .context import CURRENT_CONTEXT
from .records import IdempotencyContext

if TYPE_CHECKING:
    from .engine import Engine


class OpenTransaction:
    """The body's transaction: its connection, the body's context, what add-ons writing
    through it need from the handler (the store's table prefix, the clock, the metrics), and
    per-transaction state for them (the outbox keeps its next position there)."""

    __slots__ = ("clock", "connection", "context", "metrics", "state", "table_prefix")

    def __init__(self, connection: Any, engine: Engine, context: IdempotencyContext | None
                 ) -> None:
        self.connection = connection
        self.context = context
        self.table_prefix: str | None = getattr(engine.store, "table_prefix", None)
        self.clock = engine.clock
        self.metrics = engine.metrics
        self.state: dict[str, Any] = {}


CURRENT_TRANSACTION: ContextVar[OpenTransaction | None] = ContextVar(
    "idempotent_tasks_transaction", default=None
)


def current_transaction() -> OpenTransaction | None:
    """The open transaction of the transactional body running here, if any."""
    return CURRENT_TRANSACTION.get()


def bound_to_transaction(fn: Callable[[Any], Any], engine: Engine) -> Callable[[Any], Any]:
    """``fn(conn)`` with :data:`CURRENT_TRANSACTION` set while it runs (and while its
    awaitable is awaited, for a coroutine function on the async path)."""

    def body(conn: Any) -> Any:
        tx = OpenTransaction(conn, engine, CURRENT_CONTEXT.get())
        token = CURRENT_TRANSACTION.set(tx)
        try:
            result = fn(conn)
        finally:
            CURRENT_TRANSACTION.reset(token)
        if inspect.isawaitable(result):
            return _awaited(result, tx)
        return result

    return body


async def _awaited(result: Awaitable[Any], tx: OpenTransaction) -> Any:
    token = CURRENT_TRANSACTION.set(tx)
    try:
        return await result
    finally:
        CURRENT_TRANSACTION.reset(token)


__all__ = ["CURRENT_TRANSACTION", "OpenTransaction", "bound_to_transaction", "current_transaction"]
