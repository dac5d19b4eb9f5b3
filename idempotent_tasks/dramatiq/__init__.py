"""Dramatiq integration: exactly-once execution per (tenant, operation, key) for actors.

.. code-block:: python

    broker.add_middleware(IdempotencyMiddleware(handler))          # before declaring actors

    @idempotent_actor(permanent=(ValueError,), max_retries=3, min_backoff=1000)
    def charge(order_id: str, amount: int) -> dict: ...

    charge.send_with_options(args=("o-1", 100), idempotency_key=key, tenant="acme")
    enqueue_unique(report, 7, key="report-7", tenant="acme")  # not while one is pending

    @idempotent_actor(unique=True, key=lambda account: f"report-{account}", tenant="acme")
    def build_report(account: str) -> None: ...

    build_report.send("globex")                  # nothing new while one is pending

How it works, and why this shape
--------------------------------
The middleware *wraps the actor function* (at declaration, in ``after_declare_actor``) with
:meth:`IdempotencyHandler.run`, instead of claiming in ``before_process_message`` and
completing in ``after_process_message``.  Dramatiq's hooks are a poor place for the claim and
the outcome write: only ``MiddlewareError`` subclasses raised in ``before_process_message``
stop the actor (anything else is logged and the actor runs anyway), ``after_*`` hooks run in
reverse order and swallow exceptions (a failed outcome write would be acked as a success), and
``transactional=True`` needs the body *inside* the store's transaction.  Wrapped, claim → body
→ conditional write run in one call on the worker thread, with the handler's own guarantees:
the store being down before the body means the body does not run (fail closed), and an
outcome that cannot be written is raised, never returned.  The middleware only hands the
message to the wrapper (``before_process_message``), maps outcomes, and runs maintenance.

Outcomes (the Dramatiq column of the outcome table in docs/guarantees.md): a replay raises
``SkipMessage`` (with the Results middleware the stored result becomes the message's result);
in progress / store down / outcome not recorded raise :class:`IdempotencyRetry` (a
``dramatiq.Retry``: re-enqueued with the actor's backoff, never counted); a transient body error
is re-raised and retried by Dramatiq's Retries until the *store's* counter reaches
``max_retries``, then the message is dead-lettered; permanent errors, poisoned scopes, reused
keys and invalid input are dead-lettered at once.  Each idempotent actor gets a ``retry_when``
option that makes these decisions, so Dramatiq's ``max_retries`` never ends a message first.

Keys and tenants travel in ``message.options`` (``idempotency_key``, ``tenant`` or
``idempotency_tenant``), so any producer can set them; otherwise the actor's ``key=`` /
``tenant=`` functions of the arguments, the middleware's ``default_tenant``, and — only with
``require_key=False`` — the message id (stable across redelivery and Dramatiq retries).
The default payload (hashed to detect key reuse) is ``{"args": [...], "kwargs": {...}}``.

Crash redelivery keeps the message id and does not touch ``options["retries"]``; the store
lease decides: a redelivered message finds the scope PROCESSING, is retried (uncounted) until
the lease expires, then takes it over (counted).  Calling an actor directly (``charge(...)``)
runs the plain function, as Dramatiq's ``Actor.__call__`` does: only messages processed by a
worker are deduplicated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

try:
    import dramatiq
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise ImportError(
        "idempotent_tasks.dramatiq needs Dramatiq: pip install 'idempotent-tasks[dramatiq]'"
    ) from exc

from .._core.errors import ConfigurationError
from .._core.records import IdempotencyContext
from ..typing import (
    OnFailure,
    OnInProgress,
    OnStuck,
    OnSuccess,
    Permanent,
    Reconcile,
    Seconds,
)
from . import _state
from ._middleware import IdempotencyMiddleware, IdempotencyMiddlewareError
from ._retry_guard import RetryNotEnqueuedError
from ._runner import CONTEXT_ATTRIBUTE, IdempotencyRetry
from ._spec import ACTOR_OPTIONS, KEY_OPTION, TENANT_OPTIONS
from ._unique import UniqueActor, enqueue_unique


@overload
def idempotent_actor(fn: Callable[..., Any], /) -> dramatiq.Actor[Any, Any]: ...


@overload
def idempotent_actor(
    fn: None = None,
    /,
    *,
    permanent: Permanent = (),
    key: Callable[..., Any] | None = None,
    tenant: str | Callable[..., Any] | None = None,
    payload: Callable[..., Any] | None = None,
    ttl: Seconds | None = None,
    lease_timeout: Seconds | None = None,
    on_stuck: OnStuck | None = None,
    on_in_progress: OnInProgress | None = None,
    wait_timeout: Seconds | None = None,
    on_success: OnSuccess | None = None,
    reuse_after: Seconds | None = None,
    on_failure: OnFailure | None = None,
    reconcile: Reconcile | None = None,
    require_key: bool = True,
    max_retries: int | None = None,
    transactional: bool = False,
    operation: str | None = None,
    **actor_options: Any,
) -> Callable[[Callable[..., Any]], dramatiq.Actor[Any, Any]]: ...


def idempotent_actor(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    permanent: Permanent = (),
    key: Callable[..., Any] | None = None,
    tenant: str | Callable[..., Any] | None = None,
    payload: Callable[..., Any] | None = None,
    ttl: Seconds | None = None,
    lease_timeout: Seconds | None = None,
    on_stuck: OnStuck | None = None,
    on_in_progress: OnInProgress | None = None,
    wait_timeout: Seconds | None = None,
    on_success: OnSuccess | None = None,
    reuse_after: Seconds | None = None,
    on_failure: OnFailure | None = None,
    reconcile: Reconcile | None = None,
    require_key: bool = True,
    max_retries: int | None = None,
    transactional: bool = False,
    operation: str | None = None,
    **actor_options: Any,
) -> dramatiq.Actor[Any, Any] | Callable[[Callable[..., Any]], dramatiq.Actor[Any, Any]]:
    """``dramatiq.actor`` for a body that must run once per (tenant, operation, key).

    ``max_retries`` is the number of failed attempts the *store* counts before poisoning
    (default: the handler's, 3), not Dramatiq's retry limit.  ``permanent`` (exception types
    or a predicate) poisons and dead-letters at once.  ``key`` / ``tenant`` / ``payload``
    are functions of the actor's arguments (``tenant`` may also be a constant); message
    options set by the producer win.  ``transactional=True`` runs the body inside the
    store's transaction (SQLStore only) — reach the connection with
    :func:`current_connection`.  Every ``dramatiq.actor`` option passes through
    (``actor_name``, ``queue_name``, ``priority``, ``broker``, ``min_backoff``,
    ``max_backoff``, ``time_limit``, ``store_results``, …).  The per-operation policies are
    the actor's (``on_success`` / ``on_failure`` as ``idempotency_on_success`` /
    ``idempotency_on_failure``: Dramatiq's ``Callbacks`` owns the plain names), and so is
    ``reconcile`` (what ``on_stuck="reconcile"`` asks before a takeover).  The actor is a
    :class:`UniqueActor` unless ``actor_class=`` is given: ``unique=True`` works as there.
    """
    for name in ("max_retries", "on_success", "on_failure"):
        if f"idempotency_{name}" in actor_options:
            raise ConfigurationError(f"pass {name}=, not idempotency_{name}=")
    options: dict[str, Any] = {
        "idempotent": True,
        "permanent": permanent,
        "require_key": require_key,
        "transactional": transactional,
    }
    optional = {
        "key": key, "tenant": tenant, "payload": payload, "ttl": ttl,
        "lease_timeout": lease_timeout, "on_stuck": on_stuck,
        "idempotency_max_retries": max_retries, "operation": operation,
        "on_in_progress": on_in_progress, "wait_timeout": wait_timeout,
        "idempotency_on_success": on_success, "reuse_after": reuse_after,
        "idempotency_on_failure": on_failure, "reconcile": reconcile,
    }
    options.update({name: value for name, value in optional.items() if value is not None})
    decorator = functools.partial(_declare, options, actor_options)
    return decorator(fn) if fn is not None else decorator


def _declare(
    options: dict[str, Any], actor_options: dict[str, Any], func: Callable[..., Any]
) -> dramatiq.Actor[Any, Any]:
    actor: dramatiq.Actor[Any, Any] = dramatiq.actor(
        func, **options, **{"actor_class": UniqueActor, **actor_options}
    )
    return actor


def current_connection() -> Any:
    """The SQLAlchemy ``Connection`` of the running ``transactional=True`` body.

    Everything executed on it commits together with the scope's SUCCESS, or not at all
    (docs/transactional.md).  Outside such a body: ``CONFIGURATION_ERROR``.
    """
    conn = _state.connection.get()
    if conn is None:
        raise ConfigurationError(
            "current_connection() is only available inside a transactional=True actor body"
        )
    return conn


def get_context(message: Any) -> IdempotencyContext | None:
    """The :class:`IdempotencyContext` the middleware attached to a processed message
    (``message.idempotency_context``): tenant, operation, key, request hash, outcome."""
    ctx = getattr(message, CONTEXT_ATTRIBUTE, None)
    return ctx if isinstance(ctx, IdempotencyContext) else None


__all__ = [
    "ACTOR_OPTIONS",
    "KEY_OPTION",
    "TENANT_OPTIONS",
    "IdempotencyMiddleware",
    "IdempotencyMiddlewareError",
    "IdempotencyRetry",
    "RetryNotEnqueuedError",
    "UniqueActor",
    "current_connection",
    "enqueue_unique",
    "get_context",
    "idempotent_actor",
]
