"""One taskiq message through the engine, and its outcome in taskiq's terms.

taskiq's hooks do not wrap the task call: ``pre_execute`` runs before it, ``on_error`` /
``post_execute`` after it, and a hook cannot skip the call.  So the claim, the body and the
conditional outcome write happen in one :meth:`IdempotencyHandler.run_async` call *inside*
the task function (the :func:`~idempotent_tasks.taskiq.idempotent` wrapper); the middleware
hands the message to it (``pre_execute`` sets a context variable, read in the same asyncio
task) and acts on the outcome afterwards (``on_error``, ``post_execute``).

The taskiq column of the outcome table (docs/taskiq.md):

=================  =========================================================================
kind               the task / message
=================  =========================================================================
executed           the body's result is the task's result; the message is acked
replayed           the stored result is the task's result (the body does not run); acked
in_progress        :class:`IdempotencyRetry`: the message is held for a backoff, sent again
                   (same task id and labels), and only then acked; no result stored
failed             the body's error; sent again like ``in_progress`` (the store counted it)
poisoned           the body's error (or ``REQUEST_FAILED``) is the task's result; acked,
                   never sent again
rejected           the refusal is the task's result (invalid input, key reused); acked
store_unavailable  like ``in_progress``; the body did not run
=================  =========================================================================

taskiq brokers cannot ``nack``: "come back later" is the retry middlewares' way — a copy is
kicked before the original is acked, so a crash in between leaves a duplicate (deduplicated
by the store), never a lost message; a worker killed mid-task leaves the original unacked and
the broker delivers it again (RabbitMQ at once, Redis Streams after ``idle_timeout``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .._core import tracing
from .._core.errors import IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from ._spec import TaskSpec, resolve


class IdempotencyRetry(Exception):
    """The task must run later and nothing was counted (in progress, store down, outcome not
    recorded): the middleware sends the message again after a backoff.  ``error`` is the
    :class:`~idempotent_tasks.IdempotencyError` behind it."""

    def __init__(self, error: IdempotencyError) -> None:
        super().__init__(str(error))
        self.error = error
        self.code = error.code


@dataclass
class Delivery:
    """The message being executed, as ``pre_execute`` saw it, and its outcome once known."""

    handler: IdempotencyHandler
    default_tenant: str | None
    message: Any
    on_outcome: Callable[[Any, Outcome], None] | None = None
    outcome: Outcome | None = field(default=None)
    #: The worker's broker (for the span's ``messaging.system`` and destination).
    broker: Any = None
    #: The middleware's per-operation policies (a task's own win).
    policies: Mapping[str, Any] = field(default_factory=dict)

    async def run(self, spec: TaskSpec, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        message = self.message
        operation = spec.operation or message.task_name
        try:
            resolved = resolve(spec, message, self.default_tenant)
        except IdempotencyError as err:
            self.outcome = Outcome.refused(err, operation=operation)
            if self.on_outcome is not None:
                self.on_outcome(message, self.outcome)
            raise err from None
        with tracing.messaging(lambda: trace_attributes(self.broker, message)):
            self.outcome = outcome = await self.handler.run_async(
                _body(fn, args, kwargs), operation=operation, tenant=resolved.tenant,
                key=resolved.key, payload=resolved.payload, permanent=spec.permanent,
                require_key=spec.require_key, **{**self.policies, **spec.policies},
            )
        if self.on_outcome is not None:
            self.on_outcome(message, outcome)
        if outcome.kind in ("executed", "replayed"):
            return outcome.result
        _raise(outcome)


def trace_attributes(broker: Any, message: Any) -> dict[str, Any]:
    """The messaging semantic-convention attributes of a taskiq message, for its span."""
    module = type(broker).__module__
    system = "rabbitmq" if "aio_pika" in module else "redis" if "redis" in module else None
    attributes = {
        "messaging.system": system, "messaging.operation.type": "process",
        "messaging.destination.name": getattr(broker, "queue_name", None),
        "messaging.message.id": getattr(message, "task_id", None),
    }
    return {k: v for k, v in attributes.items() if isinstance(v, str | int)}


def _raise(outcome: Outcome) -> NoReturn:
    if outcome.kind in ("in_progress", "store_unavailable", "superseded"):
        raise IdempotencyRetry(outcome.error_object())
    if outcome.exception is not None and outcome.refusal is None:
        raise outcome.exception  # failed, or poisoned by the body's own error
    raise outcome.error_object()


def _body(fn: Callable[..., Any], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    if inspect.iscoroutinefunction(fn):
        return lambda: fn(*args, **kwargs)
    return lambda: asyncio.to_thread(fn, *args, **kwargs)


#: The delivery of the running task, set by the middleware's ``pre_execute``.  Each message
#: runs in its own asyncio task, so a value never leaks from one message to another.
current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "idempotency_taskiq_delivery", default=None
)

__all__ = ["Delivery", "IdempotencyRetry", "current"]
