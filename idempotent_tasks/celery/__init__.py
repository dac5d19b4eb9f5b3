"""Celery integration: exactly-once task bodies per (tenant, task name, idempotency key).

```python
from idempotent_tasks.celery import enqueue_unique, idempotent_task, setup

setup(app, handler)                                    # + beat entries for recovery/cleanup

@idempotent_task(permanent=(ValueError,), key=lambda order_id, amount: f"charge-{order_id}")
def charge(order_id: int, amount: int) -> dict: ...

charge.apply_async((42, 100), idempotency_key="6f1c…", tenant="acme")
enqueue_unique(report, (7,), key="report-7", tenant="acme")  # not while one is pending

@idempotent_task(unique=True, key=lambda account: "report", tenant=lambda account: account)
def build_report(account: str) -> None: ...

build_report.delay("acme")                             # nothing new while one is pending
```

Guarantees (docs/guarantees.md): duplicate deliveries of a scope whose record exists never run
the body again (the stored result is the task's result); a worker killed inside the body is
redelivered (``acks_late`` and ``reject_on_worker_lost`` are on by default) and, once the lease
expires, taken over with one counted retry — at-least-once for effects outside the store, at
most ``max_retries`` runs; with ``transactional=True`` the body's database writes commit with
the SUCCESS record, exactly once whatever is killed when.  The outcome mapping and the tuning
of leases against ``visibility_timeout`` / ``consumer_timeout`` are in docs/celery.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from celery import shared_task
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise ImportError(
        "idempotent_tasks.celery needs Celery: pip install 'idempotent-tasks[celery]'"
    ) from exc

from .._core.errors import ConfigurationError
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Reconcile, Seconds
from ._canvas import derive_key, idempotent_chain, keyed
from ._delivery import KEY_HEADER, TENANT_HEADER, RetryRequested
from ._risks import ConfigurationRiskWarning
from ._setup import check_configuration, setup, start_maintenance, stop_maintenance
from ._state import CLEANUP_TASK, RECOVER_TASK, CeleryState, get_handler
from ._task import IdempotentTask, current_connection
from ._unique import enqueue_unique


def idempotent_task(
    *args: Any,
    permanent: Permanent = (),
    key: Callable[..., str | None] | None = None,
    tenant: Callable[..., str | None] | None = None,
    payload: Callable[..., Any] | None = None,
    ttl: Seconds | None = None,
    require_key: bool = True,
    max_retries: int | None = None,
    on_stuck: OnStuck | None = None,
    lease_timeout: Seconds | None = None,
    on_in_progress: OnInProgress | None = None,
    wait_timeout: Seconds | None = None,
    on_success: OnSuccess | None = None,
    reuse_after: Seconds | None = None,
    on_failure: OnFailure | None = None,
    reconcile: Reconcile | None = None,
    transactional: bool = False,
    unique: bool = False,
    unique_until: str = "start",
    unique_lease_timeout: Seconds | None = None,
    base: type[IdempotentTask] = IdempotentTask,
    **options: Any,
) -> Any:
    """Like ``shared_task``, for an idempotent task; every ``app.task`` option passes through.

    ``max_retries`` is the number of failed attempts the store counts before poisoning
    (``None``: the handler's default, 3); Celery's own retry limit is disabled for the task.
    ``key``/``tenant``/``payload`` are functions of the task's arguments.  With
    ``transactional=True`` (SQLStore only) the body runs inside the store's transaction: its
    SQLAlchemy connection is passed as keyword ``conn`` when the function declares a ``conn``
    parameter, and is always available as :func:`current_connection`.  The per-operation
    policies (``on_in_progress``, ``wait_timeout``, ``on_success``, ``reuse_after``,
    ``on_failure``, and ``reconcile``: what ``on_stuck="reconcile"`` asks before a takeover)
    become the task's attributes; ``on_success`` / ``on_failure`` are stored
    as ``idempotency_on_success`` / ``idempotency_on_failure`` (Celery's own ``on_success`` /
    ``on_failure`` are handler methods, which stay untouched).  ``unique=True`` makes
    ``delay`` / ``apply_async`` publish only while no message of the task's scope is pending
    (``enqueue_unique``'s mark, held until ``unique_until``, for at most
    ``unique_lease_timeout`` seconds); ``apply_async(unique=False)`` opts one call out.
    """
    if not (isinstance(base, type) and issubclass(base, IdempotentTask)):
        raise ConfigurationError("idempotent_task(base=...) must be an IdempotentTask subclass")
    for name, value in (("on_success", on_success), ("on_failure", on_failure)):
        if callable(value):  # Celery's own handler method, as shared_task takes it
            options[name] = value
    options.update(
        base=base, permanent=permanent, key=key, tenant=tenant, payload=payload, ttl=ttl,
        require_key=require_key, idempotency_max_retries=max_retries, on_stuck=on_stuck,
        lease_timeout=lease_timeout, transactional=transactional, max_retries=None,
        on_in_progress=on_in_progress, wait_timeout=wait_timeout,
        idempotency_on_success=None if callable(on_success) else on_success,
        reuse_after=reuse_after,
        idempotency_on_failure=None if callable(on_failure) else on_failure,
        reconcile=reconcile, unique=unique, unique_until=unique_until,
        unique_lease_timeout=unique_lease_timeout,
    )
    return shared_task(*args, **options)


__all__ = [
    "CLEANUP_TASK",
    "KEY_HEADER",
    "RECOVER_TASK",
    "TENANT_HEADER",
    "CeleryState",
    "ConfigurationRiskWarning",
    "IdempotentTask",
    "RetryRequested",
    "check_configuration",
    "current_connection",
    "derive_key",
    "enqueue_unique",
    "get_handler",
    "idempotent_chain",
    "idempotent_task",
    "keyed",
    "setup",
    "start_maintenance",
    "stop_maintenance",
]
