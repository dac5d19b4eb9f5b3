"""Key propagation: enqueue a Celery task or Dramatiq message from inside any protected body
(an HTTP request, a Celery task, a Dramatiq actor, a consumed message) with an idempotency
key derived from the body's own scope.

Why derive rather than generate: a body that fails transiently (or whose worker crashes) is
executed again on the next delivery or the client's retry, and would enqueue its task again.
With a key derived deterministically from (tenant, operation, key) + task name + suffix +
position, the second enqueue carries the *same* key, so the task's own idempotency handling
replays instead of running twice.  A replayed delivery does not run its body at all, so it
enqueues nothing.

Position: the n-th ``enqueue_once`` of the same task name and suffix within one execution
of the body gets the n-th key, so a loop enqueuing one task per item works, provided the
body enqueues in a deterministic order (or passes distinct ``key_suffix`` values).

Inside a database transaction: an integration that owns transactions registers a
:class:`PublishDeferrer` (the Django app does: ``transaction.on_commit``), and a message
enqueued while one is open is published only once it commits — never for a body whose writes
were rolled back, and never before the task could see them.  ``enqueue_once`` then returns
what the publish will produce (the Celery ``AsyncResult`` of the task id it will use, the
Dramatiq ``Message`` it will enqueue).

Unique enqueue (``idempotent_tasks.celery.enqueue_unique``, ``idempotent_tasks.dramatiq.
enqueue_unique``, ``idempotent_tasks.taskiq.enqueue_unique``) is the producer-side twin: publish
only while no message of a scope is pending.  :func:`publish_unique` is its one algorithm;
each integration passes how to publish and how to name a pending message.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ._core.context import current_context
from ._core.errors import ConfigurationError
from ._core.keys import KEY_OPTION, TENANT_OPTION, derive_key
from ._core.records import IdempotencyContext
from ._core.unique import MARK_HEADER, UniqueMark, UniqueUntil, read_header, unique_until
from .typing import Seconds

if TYPE_CHECKING:
    from ._core.handler import IdempotencyHandler

H = TypeVar("H")

_Positions = tuple[IdempotencyContext, dict[tuple[str, str], int]]
_POSITIONS: ContextVar[_Positions | None] = ContextVar("idempotent_tasks_enqueue", default=None)
_LOCK = threading.Lock()


class PublishDeferrer(Protocol):
    """Runs a publish once the current transaction commits."""

    def __call__(self, publish: Callable[[], object]) -> bool:
        """Arrange for ``publish()`` to run after the open transaction commits (and never if
        it rolls back) and return True; return False, arranging nothing, when no transaction
        is open (the caller then publishes at once)."""
        ...


_deferrer: PublishDeferrer | None = None


def set_publish_deferrer(deferrer: PublishDeferrer | None) -> None:
    """Install (or, with ``None``, remove) the process's publish deferrer."""
    global _deferrer
    _deferrer = deferrer


def begin_enqueue_scope(ctx: IdempotencyContext) -> None:
    """Start counting positions for one body execution.

    Integrations call it before the body runs (the HTTP middlewares do), so that threads and
    tasks the body spawns (which copy the context) share one counter instead of each
    starting at 0.  Without it, the counter starts at the first ``enqueue_once``.
    """
    _POSITIONS.set((ctx, {}))


def _next_position(ctx: IdempotencyContext, name: str, suffix: str) -> int:
    state = _POSITIONS.get()
    if state is None or state[0] is not ctx:
        state = (ctx, {})
        _POSITIONS.set(state)
    with _LOCK:
        counts = state[1]
        position = counts.get((name, suffix), 0)
        counts[(name, suffix)] = position + 1
    return position


def derive_task_key(
    ctx: IdempotencyContext, task_name: str, key_suffix: str = "", position: int = 0
) -> str:
    """The key of a task enqueued from the body of ``ctx``: the hex SHA-256 of the
    length-prefixed parts (the one derivation the library uses for child keys, so no two
    different tuples of parts share a key).

    Args:
        ctx: The context of the body that enqueues (``current_context()``).
        task_name: The enqueued task's or actor's name.
        key_suffix: Tells apart several enqueues of the same task at one position.
        position: The enqueue's position within the body (``enqueue_once`` counts them).

    Returns:
        The child's key: the same on every attempt of the parent body.
    """
    return derive_key(
        ctx.tenant or "", ctx.operation, ctx.key or "", task_name, key_suffix, str(position)
    )


def _task_name(task_or_actor: Any) -> str:
    name = getattr(task_or_actor, "actor_name", None) or getattr(task_or_actor, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"cannot tell the task name of {task_or_actor!r}")
    return name


def enqueue_once(task_or_actor: Any, *args: Any, key_suffix: str = "", **kwargs: Any) -> Any:
    """Enqueue ``task_or_actor(*args, **kwargs)`` with a key derived from the current scope.

    * Dramatiq actor: ``send_with_options(args=..., kwargs=..., idempotency_key=..., tenant=...)``
      (the options travel in ``message.options``); returns the ``Message``.
    * Celery task: ``apply_async(args, kwargs, headers={"idempotency_key": ...,
      "idempotency_tenant": ...})`` — the headers every producer may set (docs/celery.md), so it
      works with any Celery version of the integration; returns the ``AsyncResult``.

    Must run inside a body the library protects (a protected request, task or message):
    outside one there is no scope to derive from, and enqueuing without a key would lose
    the exactly-once guarantee silently, so it raises ``ConfigurationError`` instead.

    Args:
        task_or_actor: A Celery task or a Dramatiq actor.
        *args: The task's positional arguments.
        key_suffix: Tells apart two enqueues of the same task from one body.
        **kwargs: The task's keyword arguments.

    Returns:
        The Dramatiq ``Message`` or the Celery ``AsyncResult``.

    Raises:
        ConfigurationError: Outside a protected body, or for an object that is neither a
            Celery task nor a Dramatiq actor.
    """
    ctx = current_context()
    if ctx is None or ctx.key is None or ctx.tenant is None:
        raise ConfigurationError(
            "enqueue_once needs an idempotent scope: call it inside a protected request, "
            "task or message body (an unkeyed request has none)"
        )
    name = _task_name(task_or_actor)
    key = derive_task_key(ctx, name, key_suffix, _next_position(ctx, name, key_suffix))
    deferrer = _deferrer
    if deferrer is not None:
        pending = _publish_later(deferrer, task_or_actor, args, kwargs, key, ctx.tenant)
        if pending is not _NOT_DEFERRED:
            return pending
    if callable(getattr(task_or_actor, "send_with_options", None)):
        return task_or_actor.send_with_options(
            args=args, kwargs=kwargs, idempotency_key=key, tenant=ctx.tenant
        )
    if callable(getattr(task_or_actor, "apply_async", None)):
        headers = {KEY_OPTION: key, TENANT_OPTION: ctx.tenant}
        return task_or_actor.apply_async(args, kwargs, headers=headers)
    raise ConfigurationError(
        f"{task_or_actor!r} is neither a Dramatiq actor nor a Celery task"
    )


_NOT_DEFERRED: Any = object()


def _publish_later(
    deferrer: PublishDeferrer, task_or_actor: Any, args: tuple[Any, ...],
    kwargs: dict[str, Any], key: str, tenant: str,
) -> Any:
    """Hand the publish to ``deferrer``; what it will produce, or ``_NOT_DEFERRED``."""
    if callable(getattr(task_or_actor, "message_with_options", None)):
        message = task_or_actor.message_with_options(
            args=args, kwargs=kwargs, idempotency_key=key, tenant=tenant
        )
        if deferrer(lambda: task_or_actor.broker.enqueue(message)):
            return message
    elif callable(getattr(task_or_actor, "apply_async", None)):
        headers = {KEY_OPTION: key, TENANT_OPTION: tenant}
        task_id = str(uuid.uuid4())
        if deferrer(lambda: task_or_actor.apply_async(
            args, kwargs, headers=headers, task_id=task_id
        )):
            return task_or_actor.AsyncResult(task_id)
    return _NOT_DEFERRED


def publish_unique(
    handler: IdempotencyHandler,
    name: str,
    *,
    tenant: str,
    key: str,
    lease_timeout: Seconds | None,
    publish: Callable[[UniqueMark], H],
    pending: Callable[[UniqueMark], H],
) -> H:
    """Take the pending-message mark of (``tenant``, task ``name``, ``key``) and
    ``publish(mark)`` the message with ``mark.message_id``; when another producer holds the
    mark, ``pending(mark)``: the handle of its message (same id), nothing published.

    A publish that raises hands the mark back at once (owner-checked), so a broker outage
    does not block the scope until the lease expires; a producer that dies before
    publishing blocks it only until then.
    """
    mark = handler.acquire_unique(name, tenant, key, lease_timeout=lease_timeout)
    if not mark.acquired:
        handler.logger.debug("unique_enqueue_pending", tenant=tenant, operation=name,
                             message_id=mark.message_id)
        return pending(mark)
    try:
        return publish(mark)
    except BaseException:
        handler.release_unique(mark)
        raise


async def publish_unique_async(
    handler: IdempotencyHandler,
    name: str,
    *,
    tenant: str,
    key: str,
    lease_timeout: Seconds | None,
    publish: Callable[[UniqueMark], Awaitable[H]],
    pending: Callable[[UniqueMark], H],
) -> H:
    """:func:`publish_unique` for async producers (the store's calls awaited, or run on the
    handler's executor for a sync store)."""
    mark = await handler.acquire_unique_async(name, tenant, key, lease_timeout=lease_timeout)
    if not mark.acquired:
        handler.logger.debug("unique_enqueue_pending", tenant=tenant, operation=name,
                             message_id=mark.message_id)
        return pending(mark)
    try:
        return await publish(mark)
    except BaseException:
        await handler.release_unique_async(mark)
        raise


async def release_carried_async(
    handler: IdempotencyHandler, carried: object, moment: UniqueUntil
) -> None:
    """:func:`release_carried` for async workers."""
    mark = _carried(carried, moment)
    if mark is not None:
        try:
            released = await handler.release_unique_async(mark)
        except Exception as exc:  # the store is down: the lease ends the mark
            _log_release(handler, mark, exc)
        else:
            _log_release(handler, mark, released)


def release_carried(handler: IdempotencyHandler, carried: object, moment: UniqueUntil) -> None:
    """The worker's side: release the mark a message carries (its header, option or label
    value) if ``moment`` is the one it was enqueued with.  Never raises into the framework:
    a mark left behind only lasts its lease."""
    mark = _carried(carried, moment)
    if mark is not None:
        try:
            released = handler.release_unique(mark)
        except Exception as exc:  # the store is down (or async): the lease ends the mark
            _log_release(handler, mark, exc)
        else:
            _log_release(handler, mark, released)


def _carried(carried: object, moment: UniqueUntil) -> UniqueMark | None:
    found = read_header(carried)
    return None if found is None or found[1] != moment else found[0]


def _log_release(handler: IdempotencyHandler, mark: UniqueMark, done: bool | Exception) -> None:
    if isinstance(done, Exception):
        handler.logger.warning("unique_mark_not_released", tenant=mark.tenant,
                               operation=mark.operation, error=repr(done))
    else:
        handler.logger.debug("unique_mark_released", tenant=mark.tenant,
                             operation=mark.operation, released=done)


__all__ = [
    "MARK_HEADER",
    "PublishDeferrer",
    "UniqueMark",
    "UniqueUntil",
    "begin_enqueue_scope",
    "derive_task_key",
    "enqueue_once",
    "publish_unique",
    "publish_unique_async",
    "release_carried",
    "release_carried_async",
    "set_publish_deferrer",
    "unique_until",
]
