"""Unique enqueue for Dramatiq: ``enqueue_unique`` on the producer, middleware hooks on the
worker.

The producer enqueues the message with an id derived from the mark and the mark in
``message.options["idempotency_unique"]``; the Retries middleware re-enqueues a copy with the
same options and id, so a retried message still carries it.  The worker releases the mark
(:class:`UniqueRelease`, called by :class:`IdempotencyMiddleware` for every actor):

* ``unique_until="start"`` — in ``before_process_message``;
* ``"finish"`` — once the message is settled for good: acked after it succeeded or was
  skipped, or nacked (dead-lettered).  The ack of a delayed message (a retry's backoff, or
  ``delay=``) that the worker moves to its queue is not one: it has not run yet.  A message
  that raised and was acked was re-enqueued by Retries, so its mark stays.  Settlement is
  the one moment that tells a retry from a final failure whatever the order of the
  middleware (the ``after_process_message`` hooks run before or after Retries' depending
  on it).

:class:`UniqueActor` is ``enqueue_unique`` behind ``send`` / ``send_with_options``, for actors
declared with ``unique=True`` (or a ``send_with_options(unique=True)``).  Dramatiq's
middleware can stop an enqueue but cannot answer it with another message, so the option
lives on the actor class (``dramatiq.actor(actor_class=...)``, Dramatiq's own extension
point); the middleware refuses ``unique`` on any other actor rather than ignore it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import dramatiq
from dramatiq.common import q_name

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.unique import MARK_HEADER, UniqueMark
from .._core.unique import unique_until as checked_until
from ..enqueue import publish_unique, release_carried
from ..typing import Seconds
from ._spec import ActorSpec, given_key, given_tenant

P = ParamSpec("P")
R = TypeVar("R")

#: Set on the worker's message proxy when processing raised (never published with it).
_RAISED = "_idempotency_unique_raised"


def enqueue_unique(
    actor: dramatiq.Actor[Any, Any],
    *args: Any,
    key: str,
    tenant: str,
    unique_until: str = "start",
    lease_timeout: Seconds | None = None,
    kwargs: dict[str, Any] | None = None,
    delay: int | None = None,
    **options: Any,
) -> dramatiq.Message[Any]:
    """``actor.send_with_options(args=args, kwargs=kwargs, delay=delay, **options)`` unless a
    message of (``tenant``, actor name, ``key``) is pending — or, with
    ``unique_until="finish"``, still running; then a ``Message`` with the pending one's
    ``message_id`` (its ``get_result`` reads the pending message's result), nothing enqueued.

    The mark lives in the store of the broker's :class:`IdempotencyMiddleware` handler, with a
    lease of ``lease_timeout`` seconds (default: the actor's ``lease_timeout``).
    """
    return _enqueue(actor, args, kwargs, delay, options, key=key, tenant=tenant,
                    until=unique_until, lease_timeout=lease_timeout)


def _enqueue(
    actor: dramatiq.Actor[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    delay: int | None,
    options: dict[str, Any],
    *,
    key: str,
    tenant: str,
    until: str,
    lease_timeout: Seconds | None,
) -> dramatiq.Message[Any]:
    """:func:`enqueue_unique` with the message options as a dict (they may hold a ``tenant``
    option of their own)."""
    checked = checked_until(until)
    handler = _handler_of(actor.broker)
    options = dict(options)

    def publish(mark: UniqueMark) -> dramatiq.Message[Any]:
        options[MARK_HEADER] = mark.header(checked)
        message = actor.message_with_options(args=args, kwargs=kwargs, **options)
        enqueued: dramatiq.Message[Any] = actor.broker.enqueue(
            message.copy(message_id=mark.message_id), delay=delay
        )
        return enqueued

    def pending(mark: UniqueMark) -> dramatiq.Message[Any]:
        message = actor.message_with_options(args=args, kwargs=kwargs, **options)
        pending_message: dramatiq.Message[Any] = message.copy(message_id=mark.message_id)
        return pending_message

    return publish_unique(handler, actor.actor_name, tenant=tenant, key=key,
                          lease_timeout=lease_timeout, publish=publish, pending=pending)


class UniqueActor(dramatiq.Actor[P, R]):
    """An actor whose ``send`` / ``send_with_options`` can publish as :func:`enqueue_unique`:
    ``@dramatiq.actor(actor_class=UniqueActor, unique=True, key=...)`` (``idempotent_actor``
    uses this class by default).

    The scope is the one the worker resolves for the message: the ``idempotency_key`` and
    ``tenant`` / ``idempotency_tenant`` options of the call, else the actor's ``key=`` /
    ``tenant=`` options, else the middleware's ``default_tenant``.  Per call,
    ``unique=``, ``unique_until=`` and ``unique_lease_timeout=`` win over the actor's.  Only
    these two methods are unique: Retries, pipelines and groups enqueue their messages as
    they are, so a retry is never held back by its own mark.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        *,
        broker: dramatiq.Broker,
        actor_name: str,
        queue_name: str,
        priority: int,
        options: dict[str, Any],
    ) -> None:
        checked_until(options.get("unique_until", "start"))  # a typo fails at declaration
        super().__init__(fn, broker=broker, actor_name=actor_name, queue_name=queue_name,
                         priority=priority, options=options)

    def send_with_options(
        self,
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        delay: timedelta | int | None = None,
        unique: bool | None = None,
        unique_until: str | None = None,
        unique_lease_timeout: Seconds | None = None,
        **options: Any,
    ) -> dramatiq.Message[R]:
        """Dramatiq's ``send_with_options``; unique (class docstring) when ``unique`` or the
        actor's ``unique`` option says so: the pending message when there is one."""
        if not (self.options.get("unique", False) if unique is None else unique):
            return super().send_with_options(args=args, kwargs=kwargs, delay=delay, **options)
        if isinstance(delay, timedelta):
            delay = int(delay.total_seconds() * 1000)
        key, tenant = self._unique_scope(args, kwargs or {}, options)
        message: dramatiq.Message[R] = _enqueue(
            self, args, kwargs, delay, options, key=key, tenant=tenant,
            until=unique_until or self.options.get("unique_until", "start"),
            lease_timeout=(self.options.get("unique_lease_timeout")
                           if unique_lease_timeout is None else unique_lease_timeout),
        )
        return message

    def _unique_scope(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]
    ) -> tuple[str, str]:
        spec = ActorSpec.from_options(self.actor_name, self.options)
        key = given_key(spec, options, args, kwargs)
        if key is None:
            raise ConfigurationError(
                f"{self.actor_name}: unique=True needs the message's idempotency key: pass "
                "idempotency_key= or give the actor a key= function of its arguments"
            )
        middleware = _middleware_of(self.broker)
        tenant = given_tenant(spec, options, args, kwargs, middleware.default_tenant)
        if tenant is None:
            raise ConfigurationError(
                f"{self.actor_name}: unique=True needs a tenant: pass tenant=, give the actor "
                "a tenant= option, or IdempotencyMiddleware(default_tenant=...)"
            )
        return key, tenant


def _middleware_of(broker: dramatiq.Broker) -> Any:
    # duck-typed: the middleware module imports this one
    for middleware in broker.middleware:
        handler = getattr(middleware, "handler", None)
        if isinstance(handler, IdempotencyHandler) and hasattr(middleware, "unique"):
            return middleware
    raise ConfigurationError(
        "enqueue_unique needs an IdempotencyMiddleware on the actor's broker"
    )


def _handler_of(broker: dramatiq.Broker) -> IdempotencyHandler:
    handler: IdempotencyHandler = _middleware_of(broker).handler
    return handler


class UniqueRelease:
    """The worker's side: release a message's mark at its moment (module docstring)."""

    def __init__(self, handler: IdempotencyHandler) -> None:
        self.handler = handler

    def started(self, message: Any) -> None:
        carried = message.options.get(MARK_HEADER)
        if carried is not None:
            release_carried(self.handler, carried, "start")

    def raised(self, message: Any) -> None:
        setattr(message, _RAISED, True)

    def settled(self, message: Any, *, acked: bool) -> None:
        # The mark first: most messages carry none, and then nothing else is read (every
        # attribute of the message proxy is a Python ``__getattr__``, a missing one an
        # exception: for speed).
        carried = message.options.get(MARK_HEADER)
        if carried is None:
            return
        if message.queue_name != q_name(message.queue_name):
            return  # a delayed message moved to its queue (a retry's backoff): not run yet
        if acked and getattr(message, _RAISED, False):
            return  # re-enqueued by Retries: the retry carries the mark
        release_carried(self.handler, carried, "finish")


__all__ = ["UniqueActor", "UniqueRelease", "enqueue_unique"]
