"""One message through the handler: execute, then map the outcome to Dramatiq's terms.

The wrapped actor calls :meth:`IdempotencyHandler.execute` (or ``execute_in_transaction``)
around the real function, so claim, body, heartbeat and the conditional outcome write happen
in one call on one thread — nothing depends on the order or error handling of Dramatiq's
``after_*`` hooks.  What the handler answered becomes:

========================================  =================================================
handler outcome                           message
========================================  =================================================
fresh result                              returned (Results stores it)
replay (body not run)                     ``SkipMessage``; with Results, the stored result
                                          becomes this message's result
REQUEST_IN_PROGRESS, STORE_UNAVAILABLE,   :class:`IdempotencyRetry` (a ``dramatiq.Retry``):
OUTCOME_NOT_RECORDED                      re-enqueued with backoff, never counted, never acked
                                          as a success
transient body error, scope released      re-raised; Retries re-enqueues it
transient body error, scope poisoned      re-raised; dead-lettered
permanent body error, REQUEST_FAILED,     re-raised; dead-lettered at once
KEY_REUSED…, invalid input, other errors
========================================  =================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.results import Results

from .._context import current_context
from .._errors import ErrorCode, IdempotencyError, StoreUnavailableError
from .._handler import IdempotencyHandler, is_permanent
from .._records import IdempotencyContext, Status
from . import _state
from ._spec import ActorSpec, Resolved, resolve

#: Codes that mean "try this message again later": the body did not run (or its outcome is
#: unknown), so retrying can never count against the scope.
RETRY_CODES = frozenset(
    {ErrorCode.REQUEST_IN_PROGRESS, ErrorCode.STORE_UNAVAILABLE, ErrorCode.OUTCOME_NOT_RECORDED}
)

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


@dataclass(slots=True)
class _Attempt:
    """What happened inside ``execute``: did the body run, and what did it raise."""

    ran: bool = False
    body_error: BaseException | None = None
    context: IdempotencyContext | None = None
    retry_count: int | None = None  # the store's counter, when it was read after a failure


@dataclass(frozen=True, slots=True)
class MessageRun:
    """Everything needed to run one message of one idempotent actor."""

    handler: IdempotencyHandler
    spec: ActorSpec
    broker: Any
    message: Any
    default_tenant: str | None

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        attempt = _Attempt()
        resolved: Resolved | None = None
        try:
            resolved = resolve(
                self.spec, self.message.options, self.message.message_id, args, kwargs,
                self.default_tenant,
            )
            value = self._execute(resolved, attempt, fn, args, kwargs)
        except BaseException as exc:
            raised = self._failed(exc, attempt, resolved)
            if raised is exc:
                raise
            raise raised from exc
        if attempt.ran:
            self._attach(attempt.context, "executed", resolved)
            return value
        self._replayed(resolved, value)
        raise dramatiq.middleware.SkipMessage("replayed: this scope already succeeded")

    # ------------------------------------------------------------------ execution
    def _execute(
        self,
        resolved: Resolved,
        attempt: _Attempt,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        spec = self.spec
        common: dict[str, Any] = {
            "operation": spec.operation, "tenant": resolved.tenant, "key": resolved.key,
            "payload": resolved.payload, "permanent": spec.permanent,
            "require_key": spec.require_key,
        }

        def body() -> Any:
            attempt.ran = True
            attempt.context = current_context()
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                attempt.body_error = exc
                raise

        if not spec.transactional:
            return self.handler.execute(body, **common)

        def tx_body(conn: Any) -> Any:
            token = _state.connection.set(conn)
            try:
                return body()
            finally:
                _state.connection.reset(token)

        return self.handler.execute_in_transaction(tx_body, **common)

    # ------------------------------------------------------------------ outcomes
    def _failed(
        self, exc: BaseException, attempt: _Attempt, resolved: Resolved | None
    ) -> BaseException:
        """Decide retry vs dead letter for ``exc``; returns the exception to raise."""
        if exc is attempt.body_error:
            decision = self._body_error_decision(exc, resolved, attempt)
            outcome = "failed" if decision is _state.Decision.RETRY else "poisoned"
        elif isinstance(exc, IdempotencyError) and exc.code in RETRY_CODES:
            decision = _state.Decision.RETRY
            outcome = "in_progress" if exc.code is ErrorCode.REQUEST_IN_PROGRESS else "retry"
        else:
            decision = _state.Decision.DEAD_LETTER
            outcome = _refusal_outcome(exc)
        ctx = attempt.context
        if ctx is not None and attempt.retry_count is not None:
            ctx.retry_count = attempt.retry_count
        self._attach(ctx, outcome, resolved, exc)
        raised: BaseException = exc
        if decision is _state.Decision.RETRY and exc is not attempt.body_error:
            assert isinstance(exc, IdempotencyError)
            raised = IdempotencyRetry(exc)
        _state.decide(raised, decision)
        self.handler.log.info(
            "dramatiq_message_" + decision.value, outcome=outcome, error=type(exc).__name__,
            code=_code(exc), operation=self.spec.operation,
            message_id=self.message.message_id, **_scope_fields(resolved),
        )
        return raised

    def _body_error_decision(
        self, exc: BaseException, resolved: Resolved | None, attempt: _Attempt
    ) -> _state.Decision:
        """Permanent → dead letter.  Transient → retry unless the store poisoned the scope
        (``max_retries`` reached); when the store cannot say, retry: the next delivery is
        refused with REQUEST_FAILED if the scope was in fact poisoned."""
        if is_permanent(exc, self.spec.permanent) or resolved is None:
            return _state.Decision.DEAD_LETTER
        try:
            record = self.handler.get_record(
                operation=self.spec.operation, tenant=resolved.tenant, key=resolved.key
            )
        except (StoreUnavailableError, IdempotencyError):
            return _state.Decision.RETRY
        if record is not None:
            attempt.retry_count = record.retry_count
        if record is not None and record.status is Status.FAILED:
            return _state.Decision.DEAD_LETTER
        return _state.Decision.RETRY

    def _replayed(self, resolved: Resolved, value: Any) -> None:
        self._attach(None, "replayed", resolved)
        self.handler.log.debug(
            "dramatiq_message_replayed", operation=self.spec.operation,
            message_id=self.message.message_id, **_scope_fields(resolved),
        )
        store_replayed_result(self.broker, self.message, value)

    # ------------------------------------------------------------------ context
    def _attach(
        self,
        ctx: IdempotencyContext | None,
        outcome: str,
        resolved: Resolved | None,
        exc: BaseException | None = None,
    ) -> None:
        """Attach the context to the message proxy (``message.idempotency_context``)."""
        if ctx is not None:
            ctx.outcome = outcome  # the handler's own context: its counter stays lazy
        else:
            ctx = IdempotencyContext(
                tenant=_text(resolved.tenant if resolved else getattr(exc, "tenant", None)),
                operation=self.spec.operation,
                key=_text(resolved.key if resolved else getattr(exc, "key", None)),
                request_hash=self._request_hash(resolved),
                outcome=outcome,
            )
        with contextlib.suppress(AttributeError):
            setattr(self.message, CONTEXT_ATTRIBUTE, ctx)

    def _request_hash(self, resolved: Resolved | None) -> str | None:
        if resolved is None:
            return None
        try:
            call = self.handler.prepare(
                self.spec.operation, resolved.tenant, resolved.key, resolved.payload,
                self.spec.require_key,
            )
        except IdempotencyError:
            return None
        return call.request_hash if call is not None else None


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


def _refusal_outcome(exc: BaseException) -> str:
    if not isinstance(exc, IdempotencyError):
        return "failed"
    if exc.code is ErrorCode.REQUEST_FAILED:
        return "poisoned"
    return "rejected"


def _code(exc: BaseException) -> str | None:
    return exc.code.value if isinstance(exc, IdempotencyError) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _scope_fields(resolved: Resolved | None) -> dict[str, Any]:
    if resolved is None:
        return {}
    return {"tenant": _text(resolved.tenant), "key": _text(resolved.key)}
