"""Unique enqueue for taskiq: ``await enqueue_unique(...)`` on the producer, middleware hooks
on the worker.

The producer kicks the task with a task id derived from the mark and the mark in the label
``idempotency_unique``; the middleware's own "send again" keeps the labels, so a message it
sends back still carries it.  The worker releases the mark (:class:`UniqueRelease`, called by
:class:`IdempotencyMiddleware` for every task of the broker):

* ``unique_until="start"`` — in ``pre_execute``;
* ``"finish"`` — in ``post_execute`` once the result is final: a success, or a failure the
  middleware knows is final (an ``@idempotent`` task's poisoned or refused message).  Any
  other error keeps the mark (a retry middleware may send the message again; the worker
  cannot tell): the mark then ends with its lease, never early.
"""

from __future__ import annotations

from typing import Any

from taskiq import AsyncTaskiqDecoratedTask, AsyncTaskiqTask, TaskiqMessage, TaskiqResult

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.unique import MARK_HEADER, UniqueMark, UniqueUntil
from .._core.unique import unique_until as checked_until
from ..enqueue import publish_unique_async, release_carried_async
from ..typing import Seconds


async def enqueue_unique(
    task: AsyncTaskiqDecoratedTask[Any, Any],
    *args: Any,
    key: str,
    tenant: str,
    unique_until: str = "start",
    lease_timeout: Seconds | None = None,
    labels: dict[str, Any] | None = None,
    **kwargs: Any,
) -> AsyncTaskiqTask[Any]:
    """``await task.kicker().with_labels(**labels).kiq(*args, **kwargs)`` unless a message of
    (``tenant``, task name, ``key``) is pending — or, with ``unique_until="finish"``, still
    running; then the pending message's ``AsyncTaskiqTask`` (same task id: ``wait_result``
    waits for its result), nothing sent.

    The mark lives in the store of the broker's :class:`IdempotencyMiddleware` handler, with a
    lease of ``lease_timeout`` seconds (default: the task's ``lease_timeout``).
    """
    until = checked_until(unique_until)
    broker = task.broker
    handler = _handler_of(broker)

    async def publish(mark: UniqueMark) -> AsyncTaskiqTask[Any]:
        kicker = task.kicker().with_task_id(mark.message_id).with_labels(
            **(labels or {}), **{MARK_HEADER: mark.header(until)}
        )
        sent: AsyncTaskiqTask[Any] = await kicker.kiq(*args, **kwargs)
        return sent

    def pending(mark: UniqueMark) -> AsyncTaskiqTask[Any]:
        return AsyncTaskiqTask(mark.message_id, broker.result_backend)

    return await publish_unique_async(handler, task.task_name, tenant=tenant, key=key,
                                      lease_timeout=lease_timeout, publish=publish,
                                      pending=pending)


def _handler_of(broker: Any) -> IdempotencyHandler:
    # duck-typed: the middleware module imports this one
    for middleware in broker.middlewares:
        handler = getattr(middleware, "handler", None)
        if isinstance(handler, IdempotencyHandler) and hasattr(middleware, "unique"):
            return handler
    raise ConfigurationError("enqueue_unique needs an IdempotencyMiddleware on the task's broker")


class UniqueRelease:
    """The worker's side: release a message's mark at its moment (module docstring)."""

    def __init__(self, handler: IdempotencyHandler) -> None:
        self.handler = handler

    async def started(self, message: TaskiqMessage) -> None:
        await self._release(message, "start")

    async def ended(self, message: TaskiqMessage, result: TaskiqResult[Any],
                    final_failure: bool) -> None:
        if not result.is_err or final_failure:
            await self._release(message, "finish")

    async def _release(self, message: TaskiqMessage, moment: UniqueUntil) -> None:
        carried = message.labels.get(MARK_HEADER)
        if carried is not None:
            await release_carried_async(self.handler, carried, moment)


__all__ = ["UniqueRelease", "enqueue_unique"]
