"""What a Celery task does with each :class:`~idempotent_tasks.Outcome` (the Celery column of
the outcome table in docs/guarantees.md):

=================  =========================================================================
kind               the task
=================  =========================================================================
executed           returns the result
replayed           returns the stored result (never ``Ignore``: that leaves it PENDING)
in_progress        ``task.retry`` with capped exponential backoff, not counted
failed             the failure is already counted (scope released): ``task.retry`` with the
                   task's own Celery retry options (``self.retry()`` options included)
poisoned           fails with no requeue: the body's own error, or ``REQUEST_FAILED``
rejected           fails with no requeue (invalid input, key reused, configuration)
store_unavailable  ``task.retry`` with backoff, body not run (or its outcome unknown)
=================  =========================================================================

Celery's own ``max_retries`` is ``None`` on idempotent tasks: the store's counter decides, and
waiting retries never use anything up.  An ``IdempotencyError``'s ``args`` carry its code and
scope, so ``.code`` survives Celery's JSON result backend.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, NoReturn

from celery import states
from celery.exceptions import Reject
from celery.utils.time import get_exponential_backoff_interval

from .._core.errors import ErrorCode, IdempotencyError, make_error
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.records import IdempotencyContext, Status
from ._delivery import Delivery, RetryRequested

_MAX_EXPONENT = 16


def apply(delivery: Delivery, outcome: Outcome) -> Any:
    """The task's answer to ``outcome``: its return value, or it raises (retry or failure)."""
    delivery.request.idempotency = outcome.context
    return ACTIONS[outcome.kind](delivery, outcome)


def _result(delivery: Delivery, outcome: Outcome) -> Any:
    return outcome.result


def _replayed(delivery: Delivery, outcome: Outcome) -> Any:
    delivery.handler.logger.debug("celery_replayed", **delivery.fields())
    return outcome.result


def _wait(delivery: Delivery, outcome: Outcome) -> NoReturn:
    """In progress, store down, or ``superseded`` (a stale owner: acking now would, on the
    Redis broker, delete the unacked entry the new owner's delivery shares with this one, so
    a kill of the new owner would lose the message): come back later, not counted; the retry
    finds the scope in progress, then replays the newer attempt's result."""
    wait_retry(delivery, outcome.error_object())


def invalid_input(task: Any, handler: IdempotencyHandler, exc: IdempotencyError) -> NoReturn:
    """A key/tenant/payload function failed: nothing ran; the task fails."""
    task.request.idempotency = IdempotencyContext(
        tenant=exc.tenant, operation=task.name, key=exc.key, request_hash=None,
        outcome="rejected",
    )
    handler.logger.warning(
        "celery_rejected", code=exc.code.value, operation=task.name, tenant=exc.tenant,
        key=exc.key, task_id=task.request.id,
    )
    raise exc


def _fail(delivery: Delivery, outcome: Outcome) -> NoReturn:
    """poisoned / rejected: the task fails with no requeue."""
    exc = outcome.exception
    if exc is None or outcome.refusal is not None:
        err = outcome.error_object()
        delivery.handler.logger.warning("celery_refused", code=err.code.value, **delivery.fields())
        raise err
    if delivery.task.is_permanent(exc):
        raise exc
    delivery.handler.logger.warning(
        "celery_poisoned", retry_count=outcome.context.retry_count, error=type(exc).__name__,
        **delivery.fields(),
    )
    raise _final_error(delivery, exc) from exc


def _final_error(delivery: Delivery, exc: BaseException) -> BaseException:
    """What a task whose retries ran out fails with: the body's error (for ``self.retry``,
    the ``exc=`` it passed), else REQUEST_FAILED."""
    if not isinstance(exc, RetryRequested):
        return exc
    original = exc.retry_options.get("exc")
    if isinstance(original, BaseException):
        return original
    d = delivery
    return make_error(
        ErrorCode.REQUEST_FAILED, "retries exhausted (the task asked for a retry too often)",
        tenant=d.tenant, operation=d.task.name, key=d.key,
    )


def wait_retry(delivery: Delivery, exc: IdempotencyError) -> NoReturn:
    """Come back later without counting a failure.  Eager mode has no broker to wait on, so
    the error is the task's result there."""
    task = delivery.task
    if task.request.is_eager:
        raise exc
    countdown = wait_countdown(task)
    delivery.handler.logger.info(
        "celery_wait_retry", code=exc.code.value, countdown=countdown, operation=task.name,
        tenant=exc.tenant, key=exc.key, task_id=task.request.id,
    )
    publish_retry(delivery, exc=exc, countdown=countdown)


def wait_countdown(task: Any) -> float:
    """Capped exponential backoff over this message's retries (jittered like Celery's)."""
    initial, cap = task.wait_backoff
    retries = int(task.request.retries or 0)
    countdown = min(cap, initial * (2 ** min(retries, _MAX_EXPONENT)))
    if getattr(task, "retry_jitter", True):
        countdown = random.uniform(countdown / 2, countdown)
    return float(countdown)


def transient_retry(delivery: Delivery, outcome: Outcome) -> NoReturn:
    """Publish the retry (the failure is already counted), with the task's retry options."""
    task, exc = delivery.task, outcome.exception
    count = outcome.context.retry_count
    options: dict[str, Any] = {}
    retry_exc: Any = exc
    if isinstance(exc, RetryRequested):
        options = dict(exc.retry_options)
        retry_exc = options.pop("exc", None)
    for ignored in ("throw", "max_retries"):  # the store's counter decides, never Celery's
        options.pop(ignored, None)
    if options.get("countdown") is None and options.get("eta") is None:
        options["countdown"] = transient_countdown(task, count)
    delivery.handler.logger.info(
        "celery_transient_retry", retry_count=count, countdown=options.get("countdown"),
        error=type(exc).__name__, **delivery.fields(),
    )
    publish_retry(delivery, exc=retry_exc, **options)


def publish_retry(delivery: Delivery, **options: Any) -> NoReturn:
    """``task.retry``, but never losing the message.

    When publishing the retry fails (the broker connection dropped), Celery's ``retry``
    raises ``Reject(requeue=False)``: with ``acks_late`` the original message would then be
    dropped, and a released scope would have nothing left to redeliver it.  Requeue the
    original instead: it comes back and is decided again (a replay, a wait, or a run).
    """
    task = delivery.task
    try:
        task.retry(**options)
    except Reject as rejected:
        if rejected.requeue:
            raise
        delivery.handler.logger.warning(
            "celery_retry_not_published", operation=task.name, task_id=task.request.id,
            error=repr(rejected.reason),
        )
        raise Reject(rejected.reason, requeue=True) from rejected
    raise AssertionError("Task.retry returned")  # pragma: no cover - retry always raises


def restore_success(task: Any, task_id: str, handler: IdempotencyHandler) -> None:
    """Once Celery stored a task's RETRY state: put the scope's result back if it succeeded.

    ``Task.retry`` publishes the retry before the worker stores RETRY, and Celery's guard
    against overwriting a SUCCESS reads the state before it writes: a retry that ran to
    SUCCESS elsewhere in between is overwritten, and the task id stays RETRY for good (its
    ``AsyncResult.get()`` never returns).  A retry's SUCCESS is written after its scope's, so
    reading the scope now sees every SUCCESS that the RETRY write can have hidden; the result
    stored is the scope's, what the retry returned or will replay.
    """
    request = task.request
    ctx = getattr(request, "idempotency", None)
    if (ctx is None or ctx.key is None or ctx.tenant is None or request.is_eager
            or task.ignore_result or getattr(request, "ignore_result", False)):
        return
    try:
        record = handler.get_record(operation=ctx.operation, tenant=ctx.tenant, key=ctx.key)
        if record is None or record.status is not Status.SUCCESS or (
                ctx.request_hash is not None and record.request_hash != ctx.request_hash):
            return
        task.backend.store_result(task_id, record.response, states.SUCCESS, request=request)
    except Exception as exc:  # the store or backend is down: the retry goes on unchecked
        handler.logger.info("celery_retry_state_unchecked", task_id=task_id, error=repr(exc))
        return
    handler.logger.info("celery_retry_state_replaced", task_id=task_id, operation=ctx.operation,
                     tenant=ctx.tenant, key=ctx.key)


def transient_countdown(task: Any, failures: int) -> float:
    """Celery's own options: ``retry_backoff`` (factor, ``retry_backoff_max``,
    ``retry_jitter``) when set, else ``default_retry_delay``."""
    backoff = getattr(task, "retry_backoff", False)
    if backoff:
        factor = 1 if backoff is True else max(1, int(backoff))
        return float(
            get_exponential_backoff_interval(
                factor, max(failures - 1, 0), int(getattr(task, "retry_backoff_max", 600)),
                bool(getattr(task, "retry_jitter", True)),
            )
        )
    return float(task.default_retry_delay or 0)


#: The Celery column of the outcome table.
ACTIONS: dict[str, Callable[[Delivery, Outcome], Any]] = {
    "executed": _result,
    "replayed": _replayed,
    "in_progress": _wait,
    "failed": transient_retry,
    "poisoned": _fail,
    "rejected": _fail,
    "store_unavailable": _wait,
    "superseded": _wait,
}

__all__ = [
    "ACTIONS", "apply", "invalid_input", "publish_retry", "restore_success", "transient_retry",
    "wait_retry",
]
