"""``IdempotentTask``: every delivery of a Celery task goes through the engine.

What is guaranteed (docs/guarantees.md): duplicate deliveries of a scope whose record exists
never run the body again; a worker killed inside the body leads (``acks_late`` +
``reject_on_worker_lost``, the defaults here) to redelivery, and once the lease expires to a
takeover that counts one retry; ``max_retries`` is the store's counter, never Celery's.

The body runs through :meth:`IdempotencyHandler.run`, so the claim, heartbeat, fencing and
recording are the engine's.  This module only resolves the scope and runs the body;
:mod:`._outcomes` maps the :class:`~idempotent_tasks.Outcome` onto what the task does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from types import FunctionType
from typing import Any

import celery
from celery.exceptions import Ignore, Reject
from structlog.contextvars import bind_contextvars, reset_contextvars

from .._core import tracing
from .._core.context import current_context
from .._core.errors import ConfigurationError, IdempotencyError
from .._core.policies import POLICY_NAMES
from .._core.unique import unique_until as checked_until
from ..typing import OnFailure, OnInProgress, OnSuccess, Permanent, Reconcile, Seconds
from . import _outcomes
from ._delivery import KEY_HEADER, TENANT_HEADER, Delivery, RetryRequested, resolve
from ._state import ATTRIBUTE, CeleryState, state_for
from ._tracing import delivery_attributes
from ._unique import apply_unique

_FUNCTION_OPTIONS = ("key", "tenant", "payload", "permanent", "reconcile")
_IN_BODY = "_idempotency_in_body"
#: Policies whose plain names are Celery's handler methods: a class that sets them to a
#: policy value (a string) has it moved to ``idempotency_<name>``.
_CLASHING_POLICIES = ("on_success", "on_failure")

_connection: ContextVar[Any] = ContextVar("idempotent_tasks_celery_connection", default=None)


def current_connection() -> Any:
    """The SQLAlchemy ``Connection`` of the running ``transactional=True`` body, else None.

    Writes made through it commit together with the task's SUCCESS record.
    """
    return _connection.get()


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
    #: The store-counted attempt limit (docs/design.md); ``None``: the handler's default.
    idempotency_max_retries: int | None = None
    #: (initial, cap) seconds for in-progress and store-down retries (never counted).
    wait_backoff: tuple[float, float] = (1.0, 60.0)
    #: The per-operation policies (``None``: the handler's).  ``on_success="reject"`` and
    #: ``on_failure="allow_new_attempt"`` are kept as ``idempotency_on_success`` /
    #: ``idempotency_on_failure``: Celery's ``on_success`` / ``on_failure`` are methods.
    on_in_progress: OnInProgress | None = None
    wait_timeout: Seconds | None = None
    reuse_after: Seconds | None = None
    idempotency_on_success: OnSuccess | None = None
    idempotency_on_failure: OnFailure | None = None
    #: ``on_stuck="reconcile"``: ``reconcile(ctx) -> Reconciled``, asked before a takeover.
    reconcile: Reconcile | None = None
    #: ``apply_async`` / ``delay`` publish only while no message of the task's scope is
    #: pending (``enqueue_unique``; ``unique=`` per call wins).  ``unique_until`` says when
    #: the mark goes: ``"start"`` or ``"finish"``; ``unique_lease_timeout`` how long a mark
    #: nobody releases lasts (``None``: the operation's ``lease_timeout``).
    unique: bool = False
    unique_until: str = "start"
    unique_lease_timeout: Seconds | None = None

    # Crash safety (docs/guarantees.md): a killed worker's message is redelivered, not lost.
    acks_late = True
    reject_on_worker_lost = True
    #: A hard ``time_limit`` kill is a crash too: the message is requeued (Celery >= 5.7 reads
    #: this) instead of acked, and the lease and the counter decide what happens next.
    acks_on_timeout = False
    max_retries = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _FUNCTION_OPTIONS:
            value = cls.__dict__.get(name)
            if isinstance(value, FunctionType):  # keep plain functions unbound
                setattr(cls, name, staticmethod(value))
        for name in _CLASHING_POLICIES:
            value = cls.__dict__.get(name)
            if isinstance(value, str):  # a policy, not Celery's handler method
                if f"idempotency_{name}" not in cls.__dict__:
                    setattr(cls, f"idempotency_{name}", value)
                delattr(cls, name)
        if "unique_until" in cls.__dict__:
            checked_until(cls.unique_until)  # a typo fails at declaration, not at a publish
        own_max = cls.__dict__.get("max_retries")
        if own_max is not None:
            if "idempotency_max_retries" not in cls.__dict__:
                cls.idempotency_max_retries = own_max
            cls.max_retries = None

    @classmethod
    def on_bound(cls, app: celery.Celery) -> None:
        """Tell the handler this task's options once the app knows it (recovery uses them)."""
        super().on_bound(app)
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
        unique: bool | None = None,
        unique_until: str | None = None,
        unique_lease_timeout: Seconds | None = None,
        **options: Any,
    ) -> Any:
        """``apply_async`` plus ``idempotency_key=`` and ``tenant=``, sent as message headers.

        ``unique=True`` (or the task's ``unique``) publishes as ``enqueue_unique`` does, in the
        task's own scope: when a message of it is pending, nothing is published and its
        ``AsyncResult`` is returned.  Celery's own publishes — a retry, a canvas member, a
        link callback — name their ``task_id`` or ``parent_id`` and are never held back.
        """
        _add_headers(options, idempotency_key, tenant)
        if self._publishes_unique(unique, task_id, options):
            options.update(producer=producer, link=link, link_error=link_error, shadow=shadow)
            return apply_unique(
                self, args, kwargs, options,
                until=self.unique_until if unique_until is None else unique_until,
                lease_timeout=(self.unique_lease_timeout if unique_lease_timeout is None
                               else unique_lease_timeout),
            )
        return super().apply_async(
            args, kwargs, task_id, producer, link, link_error, shadow, **options
        )

    def _publishes_unique(
        self, unique: bool | None, task_id: str | None, options: dict[str, Any]
    ) -> bool:
        if unique is None:  # the task's default, for the application's own publishes
            return self.unique and task_id is None and options.get("parent_id") is None
        if unique and task_id is not None:
            raise ConfigurationError("unique=True derives the task id from the mark: no task_id=")
        return unique

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
        request = self.request  # read once: each read goes through Celery's request stack
        if request.called_directly:
            # A plain function call (no message, no result): Celery semantics, no dedup.
            return super().__call__(*args, **kwargs)
        # For speed, the tokens of ``bind_contextvars`` rather than ``bound_contextvars``:
        # the same restore afterwards, without copying the whole context to save the
        # previous values (structlog's context manager does that on every entry).
        tokens = bind_contextvars(task_id=request.id, task=self.name)
        try:
            return run_delivery(self, args, kwargs, request)
        finally:
            reset_contextvars(**tokens)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Inside the body: a transient failure that the store counts *before* the retry is
        published.  Outside it: Celery's ``retry``."""
        if getattr(self.request, _IN_BODY, False):
            if args:
                raise TypeError("call self.retry() with keyword arguments in idempotent tasks")
            raise RetryRequested(kwargs)
        return super().retry(*args, **kwargs)

    def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Celery stored RETRY: if the scope succeeded meanwhile (a fast retry), its result is
        stored back (``_outcomes.restore_success``).  Overrides must call ``super()``."""
        super().on_retry(exc, task_id, args, kwargs, einfo)
        _outcomes.restore_success(self, task_id, state_for(self.app).handler)

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


def register_task_options(app: celery.Celery, task_cls: type) -> None:
    """Decorator options become the operation's defaults (call site > task > handler)."""
    state = getattr(app, ATTRIBUTE, None)
    name = getattr(task_cls, "name", None)
    if not isinstance(state, CeleryState) or not issubclass(task_cls, IdempotentTask) or not name:
        return
    current = state.handler.options_for(name)
    ttl, lease = task_cls.ttl, task_cls.lease_timeout
    state.handler.register_operation(
        name,
        ttl=current.ttl if ttl is None else ttl,
        lease_timeout=current.lease_timeout if lease is None else lease,
        max_retries=task_cls.idempotency_max_retries or current.max_retries,
        on_stuck=task_cls.on_stuck or current.on_stuck,  # type: ignore[arg-type]
        **{**{name: getattr(current, name) for name in POLICY_NAMES},
           **task_policies(task_cls)},
    )


def task_policies(task: type[IdempotentTask] | IdempotentTask) -> dict[str, Any]:
    """The policies a task sets, named as ``run``'s keywords (``None``: not set)."""
    values = {
        "on_in_progress": task.on_in_progress, "wait_timeout": task.wait_timeout,
        "on_success": task.idempotency_on_success, "reuse_after": task.reuse_after,
        "on_failure": task.idempotency_on_failure, "reconcile": task.reconcile,
    }
    return {name: value for name, value in values.items() if value is not None}



# ---------------------------------------------------------------------- running
def run_delivery(
    task: IdempotentTask, args: tuple[Any, ...], kwargs: dict[str, Any], request: Any = None
) -> Any:
    """Resolve the scope, run the body through the engine, map the outcome onto Celery
    (``request``: ``task.request``, when the caller has read it already)."""
    state = state_for(task.app)
    try:
        delivery = resolve(task, args, kwargs, state.handler, state.default_tenant, request)
    except IdempotencyError as exc:
        _outcomes.invalid_input(task, state.handler, exc)
    if task.transactional:
        body: Callable[..., Any] = lambda conn: _body(delivery, conn)  # noqa: E731
    else:
        body = lambda: _body(delivery, None)  # noqa: E731
    with tracing.messaging(lambda: delivery_attributes(task)):
        outcome = delivery.handler.run(
            body, operation=task.name, tenant=delivery.tenant, key=delivery.key,
            payload=delivery.payload, permanent=task.is_permanent,
            transactional=task.transactional, require_key=task.require_key, ttl=task.ttl,
            lease_timeout=task.lease_timeout, max_retries=task.idempotency_max_retries,
            on_stuck=task.on_stuck,  # type: ignore[arg-type]
            # The policies of ``task_policies`` by name, not ``**task_policies(task)``: None
            # is ``run``'s "not set" as well, and no dict is built per delivery (for speed).
            on_in_progress=task.on_in_progress, wait_timeout=task.wait_timeout,
            on_success=task.idempotency_on_success, reuse_after=task.reuse_after,
            on_failure=task.idempotency_on_failure, reconcile=task.reconcile,
        )
    return _outcomes.apply(delivery, outcome)


def _body(delivery: Delivery, conn: Any) -> Any:
    """The task's own code, with the context on the request and the connection published."""
    task, request = delivery.task, delivery.request
    request.idempotency = current_context()
    setattr(request, _IN_BODY, True)
    token = _connection.set(conn)
    kwargs = delivery.kwargs
    if conn is not None and _accepts_conn(task):
        kwargs = {**kwargs, "conn": conn}
    if conn is not None:  # the ``outbox`` argument, when the task declares one
        from ..outbox import outbox_kwargs

        kwargs = {**kwargs, **outbox_kwargs(task.run)}
    try:
        # The worker's tracer has already pushed this task and its request, so the body runs
        # as Celery runs a task without a custom __call__: ``run`` itself.
        return task.run(*delivery.args, **kwargs)
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
    "register_task_options",
    "run_delivery",
]
