"""The context of the body running in this thread / task.

A ``ContextVar`` rather than a shared object: a new thread starts with no context, asyncio
tasks copy theirs, and nested executions restore the outer context on exit, so scopes never
cross between threads, tasks or nesting levels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ._records import IdempotencyContext

_current: ContextVar[IdempotencyContext | None] = ContextVar(
    "idempotent_tasks_context", default=None
)


def current_context() -> IdempotencyContext | None:
    """The :class:`IdempotencyContext` of the body running in this thread/task, if any."""
    return _current.get()


@contextmanager
def bound_context(ctx: IdempotencyContext) -> Iterator[IdempotencyContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
