"""One delivery of an idempotent Celery task: where its scope comes from.

Key: the ``idempotency_key`` header > the task's ``key=`` function > the task id (only with
``require_key=False``).  Tenant: the ``idempotency_tenant`` header > ``tenant=`` >
``setup(default_tenant=)``.  Payload: ``payload=`` or ``{"args": [...], "kwargs": {...}}``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core.errors import ErrorCode, InvalidInputError
from .._core.handler import IdempotencyHandler
from .._core.keys import KEY_OPTION, TENANT_OPTION

#: Message headers read by the worker; other producers set them too (``-`` is accepted for ``_``).
KEY_HEADER = KEY_OPTION
TENANT_HEADER = TENANT_OPTION


class RetryRequested(Exception):
    """``self.retry()`` inside an idempotent body: a transient failure, counted *before* the
    retry is published (the engine records it; then the task calls Celery's real ``retry``)."""

    def __init__(self, retry_options: dict[str, Any]) -> None:
        super().__init__("task body asked for a retry")
        self.retry_options = retry_options


@dataclass(slots=True)
class Delivery:
    """One delivery as the task sees it: the resolved scope and the handler to run it on."""

    task: Any  # the IdempotentTask (typed loosely: this module sits below the task class)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    handler: IdempotencyHandler
    tenant: str | None
    key: str | None
    payload: Any
    #: ``task.request`` when the delivery was resolved: the context the worker pushed for
    #: this delivery, read once (``task.request`` is a property over Celery's stack).
    request: Any

    def fields(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant, "operation": self.task.name, "key": self.key,
            "task_id": self.request.id,
        }


def header(request: Any, name: str) -> str | None:
    """A message header in a worker or in eager mode (only ``request.headers`` there).

    Looked up in order: ``headers[name]``, the request's attribute ``name`` (a worker's
    request carries the message's headers as attributes too), ``headers[name with "-"]``.
    Runs a few times per delivery: no tuple of variants, no loop (for speed)."""
    headers = getattr(request, "headers", None)
    if not headers:  # only the attribute can hold it
        value = getattr(request, name, None) if name.isidentifier() else None
    else:
        value = headers.get(name)
        if value is None and name.isidentifier():
            value = getattr(request, name, None)
        if value is None:
            value = headers.get(name.replace("_", "-"))
    return None if value is None else str(value)


def _from_function(
    fn: Callable[..., Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any], code: ErrorCode
) -> Any:
    if fn is None:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        message = f"{code.value.lower()} function failed: {exc!r}"
        raise InvalidInputError(message, code=code) from exc


def scope_of(
    task: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    read: Callable[[str], str | None],
    default_tenant: str | None,
) -> tuple[Any, Any]:
    """(key, tenant) of a message whose headers ``read`` returns: the headers, else the task's
    ``key=`` / ``tenant=`` functions, else (tenant only) ``default_tenant``.  The producer
    (``unique=True``) and the worker resolve through it, so both name the same scope."""
    key = read(KEY_HEADER) or _from_function(task.key, args, kwargs, ErrorCode.INVALID_KEY)
    tenant = (
        read(TENANT_HEADER)
        or _from_function(task.tenant, args, kwargs, ErrorCode.INVALID_TENANT)
        or default_tenant
    )
    return key, tenant


def resolve(
    task: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    handler: IdempotencyHandler,
    default_tenant: str | None,
    request: Any = None,
) -> Delivery:
    """The delivery's scope (module docstring); a failing key/tenant/payload function is
    invalid input (``InvalidInputError`` with the matching code).  ``request``: the
    caller's ``task.request`` when it has it (each read of that property raises and catches
    an ``AttributeError`` inside Celery's thread-local stack: for speed)."""
    if request is None:
        request = task.request
    key, tenant = scope_of(task, args, kwargs, functools.partial(header, request),
                           default_tenant)
    if key is None and not task.require_key:
        key = request.id
    if task.payload is not None:
        payload = _from_function(task.payload, args, kwargs, ErrorCode.INVALID_PAYLOAD)
    else:
        payload = {"args": list(args), "kwargs": kwargs}
    return Delivery(task, args, kwargs, handler, tenant, key, payload, request)


__all__ = [
    "KEY_HEADER", "TENANT_HEADER", "Delivery", "RetryRequested", "header", "resolve", "scope_of",
]
