"""The context of the body running in this thread / task.

A ``ContextVar`` rather than a shared object: a new thread starts with no context, asyncio
tasks copy theirs, and nested executions restore the outer context on exit, so scopes never
cross between threads, tasks or nesting levels.  The handler sets and resets it around each
body (``_handler._Running``).
"""

from __future__ import annotations

from contextvars import ContextVar

from .records import IdempotencyContext

CURRENT_CONTEXT: ContextVar[IdempotencyContext | None] = ContextVar(
    "idempotent_tasks_context", default=None
)


def current_context() -> IdempotencyContext | None:
    """The :class:`IdempotencyContext` of the body running in this thread/task, if any."""
    return CURRENT_CONTEXT.get()
