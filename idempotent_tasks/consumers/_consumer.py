"""``IdempotentConsumer``: one message in, one :class:`~idempotent_tasks.Outcome` out,
exactly-once per scope.

The consumer only resolves (tenant, key, payload) from the message (``_resolve``) and hands
the body to the engine: ``handler.run`` for one message, ``handler.run_many`` for a batch (one
store round trip for all the claims).  Every decision — replay, in progress, takeover,
poisoning, counting — is the engine's, made exactly as ``IdempotencyHandler.execute`` makes
it.  Expected outcomes are values: ``process`` never raises for them; only a
``BaseException`` out of a body (``KeyboardInterrupt``), after it was counted, propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._core import tracing
from .._core.errors import ConfigurationError, ErrorCode, IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.validation import validate_operation, validate_tenant
from ..typing import (
    OnFailure,
    OnInProgress,
    OnStuck,
    OnSuccess,
    Permanent,
    Reconcile,
    Seconds,
)
from ._message import Message
from ._resolve import KeySpec, PayloadSpec, Resolved, Resolver, TenantSpec
from ._semconv import message_attributes

Body = Callable[..., Any]
#: Refusals the engine decided (and logged) itself: not invalid input.
_ENGINE_REFUSALS = (ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST, ErrorCode.DUPLICATE_REJECTED)


class IdempotentConsumer:
    """Exactly-once effects for one operation consumed from a broker.

    ``key``: ``None`` (the ``idempotency-key`` header, then the CloudEvents source + id),
    ``"coordinates"`` ((topic, partition, offset) or the message id), or a function of the
    :class:`Message`.  ``tenant``: a function of the message, else the ``idempotency-tenant``
    header, else ``default_tenant`` — never a silent shared default.  ``payload``: a function
    of the message, else the value decoded as JSON (``data`` of a structured CloudEvent).
    ``transactional=True`` runs ``fn(payload, conn)`` in the store's transaction.
    ``batch_completion=True`` writes the successes of a ``process_batch`` call together,
    after its bodies (one round trip instead of one per message): a crash between a body and
    that write re-runs the body once its lease expires, so the at-least-once window of plain
    bodies grows from one message to one batch.  Off by default.  The per-operation
    policies (``on_in_progress``, ``wait_timeout``, ``on_success``, ``reuse_after``,
    ``on_failure``; ``None``: the handler's) apply to every message of the operation, and so
    does ``reconcile`` (what ``on_stuck="reconcile"`` asks before a takeover).
    """

    def __init__(
        self,
        handler: IdempotencyHandler,
        *,
        operation: str,
        tenant: TenantSpec = None,
        default_tenant: str | None = None,
        key: KeySpec = None,
        payload: PayloadSpec = None,
        permanent: Permanent = (),
        transactional: bool = False,
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
        batch_completion: bool = False,
    ) -> None:
        if key is not None and not callable(key) and key != "coordinates":
            raise ConfigurationError("key must be None, 'coordinates' or a function of a Message")
        if transactional and not handler.supports_transactions:
            raise ConfigurationError(
                "transactional=True needs a SQL store; this handler's store cannot share a "
                "transaction with the body"
            )
        if batch_completion and transactional:
            raise ConfigurationError(
                "batch_completion=True cannot be combined with transactional=True: each "
                "success commits with its own body's transaction"
            )
        self.handler = handler
        self.batch_completion = batch_completion
        self.operation = validate_operation(operation)
        self.default_tenant = None if default_tenant is None else validate_tenant(default_tenant)
        self.permanent = permanent
        self.transactional = transactional
        self.require_key = require_key
        self._options: dict[str, Any] = {
            "ttl": ttl, "lease_timeout": lease_timeout, "max_retries": max_retries,
            "on_stuck": on_stuck, "on_in_progress": on_in_progress,
            "wait_timeout": wait_timeout, "on_success": on_success, "reuse_after": reuse_after,
            "on_failure": on_failure, "reconcile": reconcile,
        }
        #: The options given, for ``process_batch``'s calls (an unset option is not passed:
        #: each call's mapping is built per message, so it carries only what it needs).
        self._given = {k: v for k, v in self._options.items() if v is not None}
        if self._given:
            # recovery and cleanup (maintenance threads, the CLI) use the same settings
            handler.register_operation(operation, **self._options)
        self.resolver = Resolver(
            key=key, tenant=tenant, payload=payload, default_tenant=self.default_tenant
        )

    # ------------------------------------------------------------------ public API
    def process(self, message: Message, fn: Body) -> Outcome:
        """Run ``fn(payload)`` (or ``fn(payload, conn)``) at most once per scope."""
        resolved = self._resolve(message)
        if isinstance(resolved, Outcome):
            return resolved
        payload = resolved.payload
        with tracing.messaging(lambda: message_attributes(message)):
            outcome = self.handler.run(
                (lambda conn: fn(payload, conn, **_outbox(fn))) if self.transactional
                else (lambda: fn(payload)),
                operation=self.operation, tenant=resolved.tenant, key=resolved.key,
                payload=payload, permanent=self.permanent, transactional=self.transactional,
                require_key=self.require_key, **self._options,
            )
        return self._checked(message, outcome)

    def process_batch(self, messages: Sequence[Message], fn: Body) -> list[Outcome]:
        """``process`` for many messages, with one store round trip for all the claims (and,
        with ``batch_completion=True``, one for all the successes).  Per message the outcome
        is the one ``process`` would give when the messages are processed one by one."""
        resolved = [self._resolve(m) for m in messages]
        calls = [
            {"operation": self.operation, "tenant": r.tenant, "key": r.key,
             "payload": r.payload, "require_key": self.require_key, **self._given}
            for r in resolved if not isinstance(r, Outcome)
        ]
        if tracing.enabled():  # each message's span gets its own attributes
            kept = [m for m, r in zip(messages, resolved, strict=True)
                    if not isinstance(r, Outcome)]
            for call, message in zip(calls, kept, strict=True):
                call[tracing.ATTRIBUTES_ENTRY] = message_attributes(message)
        body: Body = (
            (lambda call, conn: fn(call["payload"], conn, **_outbox(fn))) if self.transactional
            else (lambda call: fn(call["payload"]))
        )
        ran = iter(self.handler.run_many(
            calls, body, permanent=self.permanent, transactional=self.transactional,
            batch_completion=self.batch_completion,
        ))
        return [
            r if isinstance(r, Outcome) else self._checked(m, next(ran))
            for m, r in zip(messages, resolved, strict=True)
        ]

    # ------------------------------------------------------------------ helpers
    def _resolve(self, message: Message) -> Resolved | Outcome:
        """The message's (tenant, key, payload); input that cannot be read is ``rejected``."""
        try:
            return self.resolver.resolve(message)
        except IdempotencyError as err:
            outcome = Outcome.refused(err, operation=self.operation)
            return self._checked(message, outcome)

    def _checked(self, message: Message, outcome: Outcome) -> Outcome:
        """Log invalid input (the engine logs every other decision)."""
        if outcome.kind == "rejected" and outcome.error_code not in _ENGINE_REFUSALS:
            code = outcome.error_code
            self.handler.logger.warning(
                "message_rejected", operation=self.operation,
                error_code=None if code is None else code.value, error=outcome.detail,
                topic=message.topic, offset=message.offset,
            )
        return outcome


def _outbox(fn: Body) -> dict[str, Any]:
    """``outbox=`` for a transactional body that declares that parameter."""
    from ..outbox import outbox_kwargs

    return outbox_kwargs(fn)


__all__ = ["IdempotentConsumer"]
