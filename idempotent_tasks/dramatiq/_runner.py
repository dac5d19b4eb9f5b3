"""One message through the engine: ``handler.run``, then the outcome in Dramatiq's terms.

The wrapped actor calls :meth:`IdempotencyHandler.run` around the real function, so claim,
body, heartbeat and the conditional outcome write happen in one call on one thread — nothing
depends on the order or error handling of Dramatiq's ``after_*`` hooks.  The Dramatiq column
of the outcome table (docs/guarantees.md):

=================  =========================================================================
kind               message
=================  =========================================================================
executed           returned (Results stores it)
replayed           ``SkipMessage``; with Results, the stored result becomes this message's
in_progress        :class:`IdempotencyRetry` (a ``dramatiq.Retry``): re-enqueued with
                   backoff, never counted, never acked as a success
failed             the body's error re-raised; Retries re-enqueues it (already counted)
poisoned           the body's error (or ``REQUEST_FAILED``) re-raised; dead-lettered at once
rejected           the refusal re-raised (invalid input, key reused); dead-lettered at once
store_unavailable  :class:`IdempotencyRetry`, like ``in_progress``
=================  =========================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import dramatiq
from dramatiq.results import Results

from .._core import tracing
from .._core.errors import IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.records import IdempotencyContext
from . import _state
from ._spec import ActorSpec, Resolved, resolve

#: The attribute of the processed message that carries its :class:`IdempotencyContext`.
CONTEXT_ATTRIBUTE = "idempotency_context"


class IdempotencyRetry(dramatiq.Retry):
    """Retry a message later without counting a failure (in progress, store down, outcome
    not recorded).  A ``dramatiq.Retry``, so the worker does not log it as an error;
    ``error`` is the :class:`~idempotent_tasks.IdempotencyError` behind it."""

    def __init__(self, error: IdempotencyError) -> None:
        super().__init__(str(error))
        self.error = error
        self.code = error.code


@dataclass(slots=True)  # not frozen: built per message, and a frozen __init__ costs more
class MessageRun:
    """Everything needed to run one message of one idempotent actor (never changed)."""

    handler: IdempotencyHandler
    spec: ActorSpec
    broker: Any
    message: Any
    default_tenant: str | None

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        spec = self.spec
        resolved = self.resolve(args, kwargs)
        with tracing.messaging(self.trace_attributes):
            outcome = self.handler.run(
                _body(fn, args, kwargs, spec.transactional), operation=spec.operation,
                tenant=resolved.tenant, key=resolved.key, payload=resolved.payload,
                permanent=spec.permanent, transactional=spec.transactional,
                require_key=spec.require_key,
            )
        return self.finish(outcome)

    def trace_attributes(self) -> dict[str, Any]:
        """The messaging semantic-convention attributes of this message, for its span."""
        name = type(self.broker).__name__
        system = "rabbitmq" if "Rabbitmq" in name else "redis" if "Redis" in name else None
        attributes = {
            "messaging.system": system, "messaging.operation.type": "process",
            "messaging.destination.name": getattr(self.message, "queue_name", None),
            "messaging.message.id": getattr(self.message, "message_id", None),
        }
        return {k: v for k, v in attributes.items() if v is not None}

    # -- the two halves of ``run``, shared with the asyncio path (``_asyncio``) -----------
    def resolve(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Resolved:
        """The message's scope parts; a key/tenant/payload function that fails dead-letters."""
        spec = self.spec
        try:
            return resolve(
                spec, self.message.options, self.message.message_id, args, kwargs,
                self.default_tenant,
            )
        except IdempotencyError as exc:
            self._attach(IdempotencyContext(
                tenant=_text(exc.tenant), operation=spec.operation, key=_text(exc.key),
                request_hash=None, outcome="rejected",
            ))
            self._raise(exc, _state.Decision.DEAD_LETTER, "rejected")

    def finish(self, outcome: Outcome) -> Any:
        """The outcome in Dramatiq's terms (the table above)."""
        self._attach(outcome.context)
        return ACTIONS[outcome.kind](self, outcome)

    # ------------------------------------------------------------------ the table
    def _result(self, outcome: Outcome) -> Any:
        return outcome.result

    def _replayed(self, outcome: Outcome) -> NoReturn:
        self.handler.logger.debug(
            "dramatiq_message_replayed", operation=self.spec.operation,
            message_id=self.message.message_id, tenant=outcome.tenant, key=outcome.key,
        )
        store_replayed_result(self.broker, self.message, outcome.result)
        raise dramatiq.middleware.SkipMessage("replayed: this scope already succeeded")

    def _wait(self, outcome: Outcome) -> NoReturn:
        """Not now: re-enqueued, never counted (in progress, store down, not recorded)."""
        self._raise(IdempotencyRetry(outcome.error_object()), _state.Decision.RETRY, outcome.kind)

    def _failed(self, outcome: Outcome) -> NoReturn:
        """A transient body error, already counted: Retries re-enqueues the message."""
        assert outcome.exception is not None
        self._raise(outcome.exception, _state.Decision.RETRY, outcome.kind)

    def _dead_letter(self, outcome: Outcome) -> NoReturn:
        """Poisoned or refused: the message fails at once."""
        exc = outcome.exception if outcome.refusal is None else None
        self._raise(exc or outcome.error_object(), _state.Decision.DEAD_LETTER, outcome.kind)

    def _raise(self, exc: BaseException, decision: _state.Decision, kind: str) -> NoReturn:
        _state.remember(exc, decision)
        self.handler.logger.info(
            "dramatiq_message_" + decision.value, outcome=kind, error=type(exc).__name__,
            code=getattr(getattr(exc, "code", None), "value", None),
            operation=self.spec.operation, message_id=self.message.message_id,
        )
        raise exc

    def _attach(self, ctx: IdempotencyContext) -> None:
        """Attach the context to the message proxy (``message.idempotency_context``)."""
        try:  # noqa: SIM105 - not ``contextlib.suppress``: runs for every message (speed)
            setattr(self.message, CONTEXT_ATTRIBUTE, ctx)
        except AttributeError:
            pass


#: The Dramatiq column of the outcome table.
ACTIONS: dict[str, Callable[[MessageRun, Outcome], Any]] = {
    "executed": MessageRun._result,
    "replayed": MessageRun._replayed,
    "in_progress": MessageRun._wait,
    "failed": MessageRun._failed,
    "poisoned": MessageRun._dead_letter,
    "rejected": MessageRun._dead_letter,
    "store_unavailable": MessageRun._wait,
    "superseded": MessageRun._wait,
}


def _body(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], transactional: bool
) -> Callable[..., Any]:
    if not transactional:
        return lambda: fn(*args, **kwargs)

    def in_transaction(conn: Any) -> Any:
        from ..outbox import outbox_kwargs  # the ``outbox`` argument, if declared

        token = _state.connection.set(conn)
        try:
            return fn(*args, **kwargs, **outbox_kwargs(fn))
        finally:
            _state.connection.reset(token)

    return in_transaction


def store_replayed_result(broker: Any, message: Any, value: Any) -> None:
    """With the Results middleware, make the replayed value this message's result.

    Dramatiq's Results stores ``None`` for a skipped message in its own ``after_skip_message``
    (whatever the middleware order), so the replay is stored here and ``store_results`` is
    switched off on this delivery's options — the message is acked right after, so the
    change never travels.
    """
    for middleware in broker.middleware:
        if not isinstance(middleware, Results):
            continue
        actor = broker.get_actor(message.actor_name)
        options = message.options
        enabled = options.get(
            "store_results", actor.options.get("store_results", middleware.store_results)
        )
        if not enabled:
            return
        ttl = options.get("result_ttl", actor.options.get("result_ttl", middleware.result_ttl))
        middleware.backend.store_result(message, value, ttl)
        options["store_results"] = False
        return


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


__all__ = ["ACTIONS", "CONTEXT_ATTRIBUTE", "IdempotencyRetry", "MessageRun"]
