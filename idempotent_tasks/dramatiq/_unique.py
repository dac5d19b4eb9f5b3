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
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.common import q_name

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.unique import MARK_HEADER, UniqueMark, UniqueUntil
from .._core.unique import unique_until as checked_until
from ..enqueue import publish_unique, release_carried
from ..typing import Seconds

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
    until = checked_until(unique_until)
    handler = _handler_of(actor.broker)

    def publish(mark: UniqueMark) -> dramatiq.Message[Any]:
        options[MARK_HEADER] = mark.header(until)
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


def _handler_of(broker: dramatiq.Broker) -> IdempotencyHandler:
    # duck-typed: the middleware module imports this one
    for middleware in broker.middleware:
        handler = getattr(middleware, "handler", None)
        if isinstance(handler, IdempotencyHandler) and hasattr(middleware, "unique"):
            return handler
    raise ConfigurationError(
        "enqueue_unique needs an IdempotencyMiddleware on the actor's broker"
    )


class UniqueRelease:
    """The worker's side: release a message's mark at its moment (module docstring)."""

    def __init__(self, handler: IdempotencyHandler) -> None:
        self.handler = handler

    def started(self, message: Any) -> None:
        self._release(message, "start")

    def raised(self, message: Any) -> None:
        setattr(message, _RAISED, True)

    def settled(self, message: Any, *, acked: bool) -> None:
        if message.queue_name != q_name(message.queue_name):
            return  # a delayed message moved to its queue (a retry's backoff): not run yet
        if acked and getattr(message, _RAISED, False):
            return  # re-enqueued by Retries: the retry carries the mark
        self._release(message, "finish")

    def _release(self, message: Any, moment: UniqueUntil) -> None:
        release_carried(self.handler, message.options.get(MARK_HEADER), moment)


__all__ = ["UniqueRelease", "enqueue_unique"]
