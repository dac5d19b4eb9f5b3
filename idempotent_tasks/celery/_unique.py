"""Unique enqueue for Celery: ``enqueue_unique`` on the producer, two signals on the worker.

The producer publishes with a task id derived from the mark and the mark in a header
(``idempotency_unique``); Celery copies a request's headers into its retries, so a retried task
still carries it.  The worker releases the mark from ``task_prerun`` (``unique_until="start"``)
or from ``task_postrun`` once the task ended with a final state (``"finish"``: SUCCESS,
FAILURE, a rejection without requeue; never RETRY nor a requeued rejection).  Signals reach
every task of the app, not only ``IdempotentTask``s, and never change what the task does: a
retry is never blocked by its own mark.
"""

from __future__ import annotations

from typing import Any

from celery import signals
from celery.result import AsyncResult

from .._core.errors import ConfigurationError
from .._core.unique import MARK_HEADER, UniqueMark, UniqueUntil
from .._core.unique import unique_until as checked_until
from ..enqueue import publish_unique, release_carried
from ..typing import Seconds
from ._delivery import header
from ._state import ATTRIBUTE, CeleryState, state_for

#: Celery states after which a task runs no more (not ``RETRY``; ``REJECTED`` only without
#: requeue: a requeued message comes back).
_FINAL_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED", "IGNORED"})


def enqueue_unique(
    task: Any,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    key: str,
    tenant: str,
    unique_until: str = "start",
    lease_timeout: Seconds | None = None,
    **apply_async_options: Any,
) -> AsyncResult:
    """``task.apply_async(args, kwargs, **apply_async_options)`` unless a message of
    (``tenant``, task name, ``key``) is pending — or, with ``unique_until="finish"``, still
    running; then the pending message's ``AsyncResult`` (same task id), nothing published.

    The mark lives in the store of the handler ``setup(app, handler)`` attached to the task's
    app, with a lease of ``lease_timeout`` seconds (default: the task's ``lease_timeout``):
    past it, a producer or worker crash no longer blocks the scope.  ``headers=`` are kept
    (the mark is added to them); ``task_id=`` is not accepted: the id is derived from the mark.
    """
    until = checked_until(unique_until)
    if "task_id" in apply_async_options:
        raise ConfigurationError("enqueue_unique derives the task id from the mark: no task_id=")
    handler = state_for(task.app).handler
    headers = dict(apply_async_options.pop("headers", None) or {})

    def publish(mark: UniqueMark) -> AsyncResult:
        headers[MARK_HEADER] = mark.header(until)
        result: AsyncResult = task.apply_async(
            args, kwargs, task_id=mark.message_id, headers=headers, **apply_async_options
        )
        return result

    def pending(mark: UniqueMark) -> AsyncResult:
        result: AsyncResult = task.AsyncResult(mark.message_id)
        return result

    return publish_unique(handler, task.name, tenant=tenant, key=key,
                          lease_timeout=lease_timeout, publish=publish, pending=pending)


def connect_release_signals() -> None:
    """Once per process (idempotent): the worker's side of every app ``setup`` was called
    for."""
    uid = "idempotent_tasks:unique"
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid=uid)
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid=uid)


def _on_prerun(task: Any = None, **_: Any) -> None:
    _release(task, "start")


def _on_postrun(
    task: Any = None, state: str | None = None, retval: Any = None, **_: Any
) -> None:
    if state in _FINAL_STATES or (state == "REJECTED" and not getattr(retval, "requeue", True)):
        _release(task, "finish")


def _release(task: Any, moment: UniqueUntil) -> None:
    carried = header(getattr(task, "request", None), MARK_HEADER)
    state = getattr(getattr(task, "app", None), ATTRIBUTE, None)
    if carried is not None and isinstance(state, CeleryState):
        release_carried(state.handler, carried, moment)


__all__ = ["connect_release_signals", "enqueue_unique"]
