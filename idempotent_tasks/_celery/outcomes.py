"""What a Celery task does with each outcome of the handler (docs/celery.md, outcome table).

* replay → the stored result is the task's result (never ``Ignore``: that leaves it PENDING);
* ``REQUEST_IN_PROGRESS``, ``STORE_UNAVAILABLE``, ``OUTCOME_NOT_RECORDED`` → ``task.retry``
  with capped exponential backoff: never counted, never ending the task (Celery's own
  ``max_retries`` is ``None`` on idempotent tasks).  The message is never acked as done;
* a transient body failure → the handler has already counted it (and released or poisoned the
  scope) when ``task.retry`` publishes the retry, honouring the task's Celery retry options;
* permanent body failure, ``REQUEST_FAILED``, ``KEY_REUSED_WITH_DIFFERENT_REQUEST``, invalid
  input → the task fails (FAILURE, no requeue) with the error; an ``IdempotencyError``'s
  ``args`` carry its code and scope, so ``.code`` survives Celery's JSON result backend.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, NoReturn

from celery.exceptions import Reject
from celery.utils.time import get_exponential_backoff_interval

from .._errors import ErrorCode, IdempotencyError, StoreUnavailableError
from .._records import IdempotencyContext, Scope, Status

if TYPE_CHECKING:
    from .task import Delivery, IdempotentTask

#: Codes that mean "not now": the same message comes back later, nothing is counted.
WAIT_CODES = frozenset(
    {ErrorCode.REQUEST_IN_PROGRESS, ErrorCode.STORE_UNAVAILABLE, ErrorCode.OUTCOME_NOT_RECORDED}
)
_MAX_EXPONENT = 16


def rejected(task: IdempotentTask, exc: IdempotencyError) -> NoReturn:
    """Invalid key/tenant/payload (or a task misconfiguration): nothing ran; the task fails."""
    task.request.idempotency = IdempotencyContext(
        tenant=exc.tenant, operation=task.name, key=exc.key, request_hash=None,
        outcome="rejected",
    )
    _log(task).warning(
        "celery_rejected", code=exc.code.value, operation=task.name, tenant=exc.tenant,
        key=exc.key, task_id=task.request.id,
    )
    raise exc


def on_error(delivery: Delivery, exc: BaseException) -> NoReturn:
    """Map an exception out of ``execute`` onto Celery (retry or fail); always raises."""
    if delivery.body_error is not None and exc is delivery.body_error:
        _body_failed(delivery, exc)
    if isinstance(exc, IdempotencyError):
        _library_error(delivery, exc)
    delivery.set_outcome("failed")
    raise exc


def _library_error(delivery: Delivery, exc: IdempotencyError) -> NoReturn:
    log = delivery.handler.log
    if exc.code in WAIT_CODES:
        in_progress = exc.code is ErrorCode.REQUEST_IN_PROGRESS
        delivery.set_outcome("in_progress" if in_progress else "failed")
        wait_retry(delivery.task, exc)
    poisoned = exc.code is ErrorCode.REQUEST_FAILED or delivery.ran
    delivery.set_outcome("poisoned" if poisoned else "rejected")
    log.warning("celery_refused", code=exc.code.value, **delivery.fields())
    raise exc


def wait_retry(task: IdempotentTask, exc: IdempotencyError) -> NoReturn:
    """Come back later without counting a failure.  Eager mode has no broker to wait on, so
    the error is the task's result there."""
    if task.request.is_eager:
        raise exc
    countdown = wait_countdown(task)
    _log(task).info(
        "celery_wait_retry", code=exc.code.value, countdown=countdown, operation=task.name,
        tenant=exc.tenant, key=exc.key, task_id=task.request.id,
    )
    publish_retry(task, exc=exc, countdown=countdown)


def wait_countdown(task: IdempotentTask) -> float:
    """Capped exponential backoff over this message's retries (jittered like Celery's)."""
    initial, cap = task.wait_backoff
    retries = int(task.request.retries or 0)
    countdown = min(cap, initial * (2 ** min(retries, _MAX_EXPONENT)))
    if getattr(task, "retry_jitter", True):
        countdown = random.uniform(countdown / 2, countdown)
    return float(countdown)


def _body_failed(delivery: Delivery, exc: BaseException) -> NoReturn:
    task = delivery.task
    if task.is_permanent(exc):
        delivery.set_outcome("poisoned")
        raise exc
    status, count = _after_failure(delivery)
    if status is Status.FAILED:
        delivery.set_outcome("poisoned", count)
        delivery.handler.log.warning(
            "celery_poisoned", retry_count=count, error=type(exc).__name__, **delivery.fields()
        )
        raise _final_error(delivery, exc) from exc
    delivery.set_outcome("failed", count)
    transient_retry(delivery, exc, count)


def _after_failure(delivery: Delivery) -> tuple[Status | None, int]:
    """The scope's state after the core recorded a transient failure (None: released)."""
    handler = delivery.handler
    fallback = int(delivery.task.request.retries or 0) + 1
    if delivery.tenant is None or delivery.key is None:  # unkeyed: nothing was counted
        return None, fallback
    scope = Scope(delivery.tenant, delivery.task.name, delivery.key)
    try:
        record = handler.store_call("get", handler.store.get, scope)
        count = handler.store_call("get_retry_count", handler.store.get_retry_count, scope)
    except StoreUnavailableError:
        return None, fallback
    return (record.status if record is not None else None), int(count)


def _final_error(delivery: Delivery, exc: BaseException) -> BaseException:
    from .task import RetryRequested

    if not isinstance(exc, RetryRequested):
        return exc
    original = exc.retry_options.get("exc")
    if isinstance(original, BaseException):
        return original
    d = delivery
    return IdempotencyError(
        "retries exhausted (the task asked for a retry too often)",
        code=ErrorCode.REQUEST_FAILED, tenant=d.tenant, operation=d.task.name, key=d.key,
    )


def transient_retry(delivery: Delivery, exc: BaseException, count: int) -> NoReturn:
    """Publish the retry (the failure is already counted), with the task's retry options."""
    from .task import RetryRequested

    task = delivery.task
    options: dict[str, Any] = {}
    retry_exc: Any = exc
    if isinstance(exc, RetryRequested):
        options = dict(exc.retry_options)
        retry_exc = options.pop("exc", None)
    for ignored in ("throw", "max_retries"):  # the store's counter decides, never Celery's
        options.pop(ignored, None)
    if options.get("countdown") is None and options.get("eta") is None:
        options["countdown"] = transient_countdown(task, count)
    delivery.handler.log.info(
        "celery_transient_retry", retry_count=count, countdown=options.get("countdown"),
        error=type(exc).__name__, **delivery.fields(),
    )
    publish_retry(task, exc=retry_exc, **options)


def publish_retry(task: IdempotentTask, **options: Any) -> NoReturn:
    """``task.retry``, but never losing the message.

    When publishing the retry fails (the broker connection dropped), Celery's ``retry``
    raises ``Reject(requeue=False)``: with ``acks_late`` the original message would then be
    dropped, and a released scope would have nothing left to redeliver it.  Requeue the
    original instead: it comes back and is decided again (a replay, a wait, or a run).
    """
    try:
        task.retry(**options)
    except Reject as rejected:
        if rejected.requeue:
            raise
        _log(task).warning(
            "celery_retry_not_published", operation=task.name, task_id=task.request.id,
            error=repr(rejected.reason),
        )
        raise Reject(rejected.reason, requeue=True) from rejected
    raise AssertionError("Task.retry returned")  # pragma: no cover - retry always raises


def transient_countdown(task: IdempotentTask, failures: int) -> float:
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


def _log(task: IdempotentTask) -> Any:
    from .state import state_for

    return state_for(task.app).handler.log
