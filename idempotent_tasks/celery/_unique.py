"""Unique enqueue for Celery: ``enqueue_unique`` on the producer, two signals on the worker.

The producer publishes with a task id derived from the mark and the mark in a header
(``idempotency_unique``); Celery copies a request's headers into its retries, so a retried task
still carries it.  The worker releases the mark from ``task_prerun`` (``unique_until="start"``)
or from ``task_postrun`` once the task ended with a final state (``"finish"``: SUCCESS,
FAILURE, a rejection without requeue; never RETRY nor a requeued rejection).  Signals reach
every task of the app, not only ``IdempotentTask``s, and never change what the task does: a
retry is never blocked by its own mark.

``IdempotentTask``'s ``unique=True`` option (:func:`apply_unique`) is ``enqueue_unique`` behind
``apply_async``/``delay``, with the scope the worker will resolve: the mark's key *is* the
task's idempotency key.
"""

from __future__ import annotations

from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any

from celery import signals
from celery.result import AsyncResult

from .._core.errors import ConfigurationError
from .._core.unique import MARK_HEADER, UniqueMark, UniqueUntil
from .._core.unique import unique_until as checked_until
from ..enqueue import publish_unique, release_carried
from ..typing import Seconds
from ._delivery import header, scope_of
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


def apply_unique(
    task: Any,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
    *,
    until: str,
    lease_timeout: Seconds | None,
) -> AsyncResult:
    """``enqueue_unique`` for a task's ``unique=True`` publish: the scope is the one the worker
    resolves for the message (the ``idempotency_key`` / ``idempotency_tenant`` headers, else
    the task's ``key=`` / ``tenant=`` functions of the arguments, else ``setup``'s
    ``default_tenant``).  Without a key or a tenant there is no scope to be unique in:
    CONFIGURATION_ERROR, nothing published."""
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    sent = SimpleNamespace(headers=options.get("headers") or {})
    key, tenant = scope_of(task, args, kwargs, lambda name: header(sent, name),
                           state_for(task.app).default_tenant)
    if key is None:
        raise ConfigurationError(
            f"{task.name}: unique=True needs the task's idempotency key: pass "
            "idempotency_key= or give the task a key= function of its arguments"
        )
    if tenant is None:
        raise ConfigurationError(
            f"{task.name}: unique=True needs a tenant: pass tenant=, give the task a tenant= "
            "function, or setup(app, handler, default_tenant=...)"
        )
    return enqueue_unique(task, args, kwargs, key=key, tenant=tenant, unique_until=until,
                          lease_timeout=lease_timeout, **options)


def connect_release_signals() -> None:
    """Once per process (idempotent): the worker's side of every app ``setup`` was called
    for."""
    uid = "idempotent_tasks:unique"
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid=uid)
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid=uid)


#: The id of the task whose ``task_prerun`` found no mark on its request: its
#: ``task_postrun`` (same thread, same context) need not read the request again.  For speed:
#: every read of ``task.request`` goes through Celery's thread-local stack, which raises and
#: catches an ``AttributeError`` each time, and most tasks carry no mark.
_unmarked: ContextVar[str | None] = ContextVar("idempotent_tasks_unmarked", default=None)


def _on_prerun(task: Any = None, task_id: str | None = None, **_: Any) -> None:
    _unmarked.set(None if _release(task, "start") else task_id)


def _on_postrun(
    task: Any = None, task_id: str | None = None, state: str | None = None,
    retval: Any = None, **_: Any,
) -> None:
    if task_id is not None and _unmarked.get() == task_id:
        return  # its prerun read the same request: no mark
    if state in _FINAL_STATES or (state == "REJECTED" and not getattr(retval, "requeue", True)):
        _release(task, "finish")


def _release(task: Any, moment: UniqueUntil) -> bool:
    """Release the mark the task's request carries, if ``moment`` is its own; False when
    the request carries none."""
    carried = header(getattr(task, "request", None), MARK_HEADER)
    if carried is None:
        return False
    state = getattr(getattr(task, "app", None), ATTRIBUTE, None)
    if isinstance(state, CeleryState):
        release_carried(state.handler, carried, moment)
    return True


__all__ = ["apply_unique", "connect_release_signals", "enqueue_unique"]
