"""``IdempotentTask``: every delivery of a Celery task goes through the handler.

What is guaranteed (DESIGN.md §2c): duplicate deliveries of a scope whose record exists never
run the body again; a worker killed inside the body leads (``acks_late`` +
``reject_on_worker_lost``, the defaults here) to redelivery, and once the lease expires to a
takeover that counts one retry; ``max_retries`` is the store's counter, never Celery's.

The body runs through :meth:`IdempotencyHandler.execute` (or ``execute_in_transaction``), so
the claim, heartbeat, fencing and recording are the core's.  This module only decides what a
Celery task does with each outcome (see :mod:`idempotent_tasks._celery.outcomes`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import FunctionType
from typing import Any

import celery
import structlog
from celery.exceptions import Ignore, Reject

from .._context import current_context
from .._errors import ErrorCode, IdempotencyError, InvalidInputError
from .._handler import Call, IdempotencyHandler, Permanent, Seconds
from .._records import IdempotencyContext
from . import outcomes
from .state import state_for

#: Message headers read by the worker; other producers set them too (``-`` is accepted for ``_``).
KEY_HEADER = "idempotency_key"
TENANT_HEADER = "idempotency_tenant"

_FUNCTION_OPTIONS = ("key", "tenant", "payload", "permanent")
_IN_BODY = "_idempotency_in_body"

_connection: ContextVar[Any] = ContextVar("idempotent_tasks_celery_connection", default=None)


def current_connection() -> Any:
    """The SQLAlchemy ``Connection`` of the running ``transactional=True`` body, else None.

    Writes made through it commit together with the task's SUCCESS record (DESIGN.md §2b).
    """
    return _connection.get()


class RetryRequested(Exception):
    """``self.retry()`` inside an idempotent body: a transient failure, counted *before* the
    retry is published (the core records it; then the task calls Celery's real ``retry``)."""

    def __init__(self, retry_options: dict[str, Any]) -> None:
        super().__init__("task body asked for a retry")
        self.retry_options = retry_options


@dataclass(slots=True)
class Delivery:
    """One delivery as the task sees it: the resolved scope and what happened to the body."""

    task: IdempotentTask
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    handler: IdempotencyHandler
    tenant: str | None
    key: str | None
    payload: Any
    request_hash: str | None = None
    ran: bool = False
    body_error: BaseException | None = None
    context: IdempotencyContext | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant, "operation": self.task.name, "key": self.key,
            "task_id": self.task.request.id,
        }

    def set_outcome(self, outcome: str, retry_count: int | None = None) -> None:
        """Record what the library decided on ``task.request.idempotency``.  The handler's
        own context is reused as it is: its retry counter is read only if someone asks."""
        if self.context is None:
            self.context = IdempotencyContext(
                tenant=self.tenant, operation=self.task.name, key=self.key,
                request_hash=self.request_hash, outcome=outcome, retry_count=retry_count or 0,
            )
        elif retry_count is not None:
            self.context.retry_count = retry_count
        self.context.outcome = outcome
        self.task.request.idempotency = self.context


class IdempotentTask(celery.Task):  # type: ignore[misc]
    """Base class of idempotent tasks: ``@app.task(base=IdempotentTask, permanent=(...))``.

    The idempotency options are class attributes, so every ``app.task`` option works with
    them.  ``max_retries`` given to the decorator is the handler's (failed attempts before
    poisoning); Celery's own ``max_retries`` is kept at ``None`` so it never ends a task first.
    """

    #: Exceptions (tuple) or a predicate that poison the scope instead of retrying.
    permanent: Permanent = ()
    #: ``key(*args, **kwargs) -> str``: the key when no ``idempotency_key`` header is sent.
    key: Callable[..., str | None] | None = None
    #: ``tenant(*args, **kwargs) -> str``: the tenant when no ``idempotency_tenant`` header.
    tenant: Callable[..., str | None] | None = None
    #: ``payload(*args, **kwargs)``: what is hashed; default ``{"args": ..., "kwargs": ...}``.
    payload: Callable[..., Any] | None = None
    ttl: Seconds | None = None
    lease_timeout: Seconds | None = None
    on_stuck: str | None = None
    require_key: bool = True
    transactional: bool = False
    #: The store-counted attempt limit (DESIGN.md §2.8); ``None``: the handler's default.
    idempotency_max_retries: int | None = None
    #: (initial, cap) seconds for in-progress and store-down retries (never counted).
    wait_backoff: tuple[float, float] = (1.0, 60.0)

    # Crash safety (DESIGN.md §2c): a killed worker's message is redelivered, not lost.
    acks_late = True
    reject_on_worker_lost = True
    max_retries = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _FUNCTION_OPTIONS:
            value = cls.__dict__.get(name)
            if isinstance(value, FunctionType):  # keep plain functions unbound
                setattr(cls, name, staticmethod(value))
        own_max = cls.__dict__.get("max_retries")
        if own_max is not None:
            if "idempotency_max_retries" not in cls.__dict__:
                cls.idempotency_max_retries = own_max
            cls.max_retries = None

    @classmethod
    def on_bound(cls, app: celery.Celery) -> None:
        """Tell the handler this task's options once the app knows it (recovery uses them)."""
        super().on_bound(app)
        from .state import register_task_options

        register_task_options(app, cls)

    # ------------------------------------------------------------------ producing
    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
        **options: Any,
    ) -> Any:
        """``apply_async`` plus ``idempotency_key=`` and ``tenant=``, sent as message headers."""
        _add_headers(options, idempotency_key, tenant)
        return super().apply_async(
            args, kwargs, task_id, producer, link, link_error, shadow, **options
        )

    def apply(
        self,
        args: Any = None,
        kwargs: Any = None,
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
        **options: Any,
    ) -> Any:
        """Eager execution with the same ``idempotency_key=`` / ``tenant=`` options."""
        _add_headers(options, idempotency_key, tenant)
        return super().apply(args, kwargs, **options)

    # ------------------------------------------------------------------ executing
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            # A plain function call (no message, no result): Celery semantics, no dedup.
            return super().__call__(*args, **kwargs)
        with structlog.contextvars.bound_contextvars(task_id=self.request.id, task=self.name):
            return run_delivery(self, args, kwargs)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Inside the body: a transient failure that the store counts *before* the retry is
        published.  Outside it: Celery's ``retry``."""
        if getattr(self.request, _IN_BODY, False):
            if args:
                raise TypeError("call self.retry() with keyword arguments in idempotent tasks")
            raise RetryRequested(kwargs)
        return super().retry(*args, **kwargs)

    def is_permanent(self, exc: BaseException) -> bool:
        """``permanent=`` plus Celery's own "never again" signals: ``Reject(requeue=False)``
        and ``Ignore``.  Everything else (``SoftTimeLimitExceeded`` included) is transient."""
        if isinstance(exc, Ignore) or (isinstance(exc, Reject) and not exc.requeue):
            return True
        permanent = self.permanent
        if isinstance(permanent, tuple):
            return bool(permanent) and isinstance(exc, permanent)
        return bool(permanent(exc))


def _add_headers(options: dict[str, Any], key: str | None, tenant: str | None) -> None:
    if key is None and tenant is None:
        return
    headers = dict(options.get("headers") or {})
    if key is not None:
        headers[KEY_HEADER] = key
    if tenant is not None:
        headers[TENANT_HEADER] = tenant
    options["headers"] = headers


# ---------------------------------------------------------------------- resolving the scope
def header(request: Any, name: str) -> str | None:
    """A message header in a worker or in eager mode (only ``request.headers`` there)."""
    headers = getattr(request, "headers", None) or {}
    for variant in (name, name.replace("_", "-")):
        value = headers.get(variant)
        if value is None:
            value = getattr(request, variant, None) if variant.isidentifier() else None
        if value is not None:
            return str(value)
    return None


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


def resolve(task: IdempotentTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Delivery:
    """Key: header > ``key=`` > task id (only with ``require_key=False``).  Tenant: header >
    ``tenant=`` > ``setup(default_tenant=)``.  Payload: ``payload=`` or args and kwargs."""
    state = state_for(task.app)
    request = task.request
    key = header(request, KEY_HEADER) or _from_function(
        task.key, args, kwargs, ErrorCode.INVALID_KEY
    )
    if key is None and not task.require_key:
        key = request.id
    tenant = (
        header(request, TENANT_HEADER)
        or _from_function(task.tenant, args, kwargs, ErrorCode.INVALID_TENANT)
        or state.default_tenant
    )
    if task.payload is not None:
        payload = _from_function(task.payload, args, kwargs, ErrorCode.INVALID_PAYLOAD)
    else:
        payload = {"args": list(args), "kwargs": kwargs}
    return Delivery(task, args, kwargs, state.handler, tenant, key, payload)


# ---------------------------------------------------------------------- running
def run_delivery(task: IdempotentTask, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Resolve, claim, run, record, and map the outcome onto Celery (module docstring)."""
    try:
        delivery = resolve(task, args, kwargs)
        call = delivery.handler.prepare(
            task.name, delivery.tenant, delivery.key, delivery.payload, task.require_key,
            **_options(task),
        )
    except IdempotencyError as exc:
        outcomes.rejected(task, exc)
    delivery.request_hash = call.request_hash if call is not None else None
    try:
        result = _execute(delivery, call)
    except BaseException as exc:
        outcomes.on_error(delivery, exc)
        raise
    delivery.set_outcome("executed" if delivery.ran else "replayed")
    if not delivery.ran:
        delivery.handler.log.debug("celery_replayed", **delivery.fields())
    return result


def _options(task: IdempotentTask) -> dict[str, Any]:
    return {
        "ttl": task.ttl, "lease_timeout": task.lease_timeout,
        "max_retries": task.idempotency_max_retries, "on_stuck": task.on_stuck,
    }


def _execute(delivery: Delivery, call: Call | None) -> Any:
    """Claim the already prepared call and run it (validated and hashed once)."""
    task, handler = delivery.task, delivery.handler
    if call is not None:
        claim = handler.claim(call)
        if not claim.owned:
            return claim.replay
        if task.transactional:
            return handler.run_claimed(
                call, claim, lambda conn: _body(delivery, conn), task.is_permanent,
                transactional=True,
            )
        return handler.run_claimed(call, claim, lambda: _body(delivery, None), task.is_permanent)
    common: dict[str, Any] = {
        "operation": task.name, "tenant": delivery.tenant, "key": delivery.key,
        "payload": delivery.payload, "permanent": task.is_permanent,
        "require_key": task.require_key, **_options(task),
    }
    if task.transactional:
        return delivery.handler.execute_in_transaction(
            lambda conn: _body(delivery, conn), **common
        )
    return delivery.handler.execute(lambda: _body(delivery, None), **common)


def _body(delivery: Delivery, conn: Any) -> Any:
    """The task's own code, with the context on the request and the connection published."""
    task = delivery.task
    delivery.ran = True
    delivery.context = current_context()
    delivery.set_outcome("executing")
    request = task.request
    setattr(request, _IN_BODY, True)
    token = _connection.set(conn)
    kwargs = delivery.kwargs
    if conn is not None and _accepts_conn(task):
        kwargs = {**kwargs, "conn": conn}
    try:
        # The worker's tracer has already pushed this task and its request, so the body runs
        # as Celery runs a task without a custom __call__: ``run`` itself.
        return task.run(*delivery.args, **kwargs)
    except BaseException as exc:
        delivery.body_error = exc
        raise
    finally:
        _connection.reset(token)
        setattr(request, _IN_BODY, False)


def _accepts_conn(task: IdempotentTask) -> bool:
    try:
        return "conn" in inspect.signature(task.run).parameters
    except (TypeError, ValueError):
        return False


__all__ = [
    "KEY_HEADER",
    "TENANT_HEADER",
    "IdempotentTask",
    "RetryRequested",
    "current_connection",
]
