"""``@idempotent(broker, ...)``: ``broker.task`` for a body that must run once per
(tenant, operation, key).

The task function registered with taskiq is a wrapper with the body's signature (taskiq
parses arguments and resolves dependencies from it, as for the body itself) that runs the
body through the engine when the middleware handed it a message.  Called directly
(``await charge.original_func(...)``, or ``await charge(...)``), it runs the plain body, as
taskiq does: only messages executed by a worker are deduplicated.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .._core.errors import ConfigurationError
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Seconds
from . import _delivery
from ._spec import MARK_LABEL, SPEC_ATTRIBUTE, TaskSpec

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(
    broker: Any,
    task_name: str | None = None,
    *,
    permanent: Permanent = (),
    key: Callable[..., Any] | None = None,
    tenant: str | Callable[..., Any] | None = None,
    payload: Callable[..., Any] | None = None,
    require_key: bool = True,
    ttl: Seconds | None = None,
    lease_timeout: Seconds | None = None,
    max_retries: int | None = None,
    on_stuck: OnStuck | None = None,
    operation: str | None = None,
    on_in_progress: OnInProgress | None = None,
    wait_timeout: Seconds | None = None,
    on_success: OnSuccess | None = None,
    reuse_after: Seconds | None = None,
    on_failure: OnFailure | None = None,
    **labels: Any,
) -> Callable[[F], Any]:
    """Register the decorated function as a taskiq task of ``broker`` that runs at most once
    per (tenant, operation, key).

    The operation is the task name unless ``operation`` is given.  Keys and tenants come
    from the message labels ``idempotency_key`` / ``idempotency_tenant``
    (:func:`idempotency_labels`), else from ``key`` / ``tenant`` (functions of the task's
    arguments; ``tenant`` may be a constant), the middleware's ``default_tenant``, and —
    only with ``require_key=False`` — the task id.  ``max_retries`` is the number of failed
    attempts the store counts before poisoning.  The per-operation policies
    (``on_in_progress``, ``wait_timeout``, ``on_success``, ``reuse_after``, ``on_failure``)
    win over the middleware's, which win over the handler's.  Other keyword arguments are
    taskiq labels.

    Args:
        broker: The taskiq broker (with :class:`IdempotencyMiddleware` added).
        task_name: The task's name (default: taskiq's, from the function).
        **labels: taskiq labels of the task; the other options are described above.

    Returns:
        A decorator that registers the function as the broker's task.
    """
    spec = TaskSpec(
        permanent=permanent, key=key, tenant=tenant, payload=payload, require_key=require_key,
        ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
        operation=operation, on_in_progress=on_in_progress, wait_timeout=wait_timeout,
        on_success=on_success, reuse_after=reuse_after, on_failure=on_failure,
    )

    return functools.partial(_register, broker, task_name, spec, labels)


def _register(
    broker: Any, task_name: str | None, spec: TaskSpec, labels: dict[str, Any], fn: F
) -> Any:
    """``fn`` as ``broker``'s task whose deliveries run through the middleware's engine;
    called directly (not as a delivery of this task) it is the plain function."""
    registered: dict[str, str] = {}

    @functools.wraps(fn)
    async def task(*args: Any, **kwargs: Any) -> Any:
        delivery = _delivery.current.get()
        if delivery is None or delivery.message.task_name != registered.get("name"):
            _check_direct_call(broker)
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        return await delivery.run(spec, fn, args, kwargs)

    setattr(task, SPEC_ATTRIBUTE, spec)
    decorated = broker.task(task_name, **{MARK_LABEL: True, **labels})(task)
    registered["name"] = decorated.task_name
    return decorated


def _check_direct_call(broker: Any) -> None:
    """A worker without the middleware would run every message without deduplication."""
    if not getattr(broker, "is_worker_process", False):
        return
    from ._middleware import IdempotencyMiddleware

    if not any(isinstance(m, IdempotencyMiddleware) for m in broker.middlewares):
        raise ConfigurationError(
            "an @idempotent task ran on a worker whose broker has no IdempotencyMiddleware: "
            "broker.add_middlewares(IdempotencyMiddleware(handler))"
        )


__all__ = ["idempotent"]
