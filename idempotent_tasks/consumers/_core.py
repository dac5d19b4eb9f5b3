"""``IdempotentConsumer``: one message in, one :class:`Outcome` out, exactly-once per scope.

The consumer resolves (tenant, key, payload) from the message (``_resolve``), then runs the
handler's phases — ``prepare`` → ``claim`` → body → ``complete`` / ``on_body_error`` — so every
decision (replay, in progress, takeover, poisoning, counting) is the handler's, made exactly
as ``IdempotencyHandler.execute`` makes it.  Expected outcomes are values: ``process`` never
raises for them; only programming errors (and ``BaseException`` such as ``KeyboardInterrupt``
out of a body, after it was counted) propagate.

``process_batch`` claims every distinct scope of a batch with **one** ``store.create_many``
round trip, then runs the bodies in message order, each outcome recorded as its body ends
(or, with ``batch_completion=True``, the successes together after the batch's bodies with
**one** ``store.mark_success_many``: ``handler.complete_many``).  Per message the outcome is
the one ``process`` would give when the messages are processed one after another: a
DUPLICATE from the batch claim goes through the handler's own duplicate decision, and a scope
that occurs twice in one batch is claimed by its first occurrence only — the later ones are
handled as duplicates after the first one is recorded.  A crash mid-batch leaves every
claimed scope PROCESSING that was not recorded yet; each lease then expires and the takeover
counts one attempt per such message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError, ErrorCode, IdempotencyError, StoreUnavailableError
from .._handler import Call, Claim, IdempotencyHandler, OnStuck, Permanent, Seconds, is_permanent
from .._handler import new_token as _new_token
from .._records import Scope, Status
from .._scope import validate_operation, validate_tenant
from ..stores.base import ClaimRequest, TransactionalStore
from ._message import Message, Outcome, OutcomeKind
from ._resolve import KeySpec, PayloadSpec, Resolved, Resolver, TenantSpec

#: How a refusal from the handler (by error code) maps to an outcome kind.
_KIND_BY_CODE: dict[ErrorCode, OutcomeKind] = {
    ErrorCode.REQUEST_IN_PROGRESS: "in_progress",
    ErrorCode.STORE_UNAVAILABLE: "store_unavailable",
    # The body ran but its outcome is not written: like a dead store for acking purposes —
    # the message comes back and the lease decides (§2c).
    ErrorCode.OUTCOME_NOT_RECORDED: "store_unavailable",
    ErrorCode.REQUEST_FAILED: "poisoned",
    ErrorCode.RESPONSE_NOT_SERIALIZABLE: "poisoned",
    ErrorCode.CONFIGURATION_ERROR: "poisoned",
    ErrorCode.INTERNAL_ERROR: "poisoned",
}

Body = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A message whose inputs validated; ``call`` is ``None`` for an unkeyed message."""

    message: Message
    resolved: Resolved
    call: Call | None


@dataclass(slots=True)
class _Ran:
    """A batch message (at ``index``) whose body returned; its success is not written yet."""

    index: int
    call: Call
    claim: Claim
    result: Any

    @property
    def token(self) -> int:
        assert self.claim.token is not None
        return self.claim.token

    @property
    def retry_count(self) -> int:
        return self.claim.retry_count


class _BodyRun:
    """Calls the user's body and remembers what *it* raised, so that errors of the body are
    told apart from the library's own refusals raised around it."""

    def __init__(self, fn: Body, payload: Any) -> None:
        self.fn = fn
        self.payload = payload
        self.error: BaseException | None = None

    def __call__(self, *conn: Any) -> Any:
        try:
            return self.fn(self.payload, *conn)
        except BaseException as exc:
            self.error = exc
            raise


class IdempotentConsumer:
    """Exactly-once effects for one operation consumed from a broker (DESIGN.md §4).

    ``key``: ``None`` (the ``idempotency-key`` header, then the CloudEvents source + id),
    ``"coordinates"`` ((topic, partition, offset) or the message id), or a function of the
    :class:`Message`.  ``tenant``: a function of the message, else the ``idempotency-tenant``
    header, else ``default_tenant`` — never a silent shared default.  ``payload``: a function
    of the message, else the value decoded as JSON (``data`` of a structured CloudEvent).
    ``transactional=True`` runs ``fn(payload, conn)`` in the store's transaction (§2b).
    ``batch_completion=True`` writes the successes of a ``process_batch`` call together,
    after its bodies (one round trip instead of one per message): a crash between a body and
    that write re-runs the body once its lease expires, so the at-least-once window of plain
    bodies grows from one message to one batch.  Off by default.
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
        batch_completion: bool = False,
    ) -> None:
        if key is not None and not callable(key) and key != "coordinates":
            raise ConfigurationError("key must be None, 'coordinates' or a function of a Message")
        if transactional and not isinstance(handler.store, TransactionalStore):
            raise ConfigurationError(
                f"transactional=True needs a SQLStore; {type(handler.store).__name__} cannot "
                "share a transaction with the body"
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
        self._overrides = (ttl, lease_timeout, max_retries, on_stuck)
        if any(o is not None for o in self._overrides):
            # recovery and cleanup (maintenance threads, the CLI) use the same settings
            handler.register_operation(
                operation, ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries,
                on_stuck=on_stuck,
            )
        self.resolver = Resolver(
            key=key, tenant=tenant, payload=payload, default_tenant=self.default_tenant
        )

    # ------------------------------------------------------------------ public API
    def process(self, message: Message, fn: Body) -> Outcome:
        """Run ``fn(payload)`` (or ``fn(payload, conn)``) at most once per scope."""
        prepared = self._prepare(message)
        if isinstance(prepared, Outcome):
            return prepared
        return self._claim_and_run(prepared, fn)

    def process_batch(self, messages: Sequence[Message], fn: Body) -> list[Outcome]:
        """``process`` for many messages, with one store round trip for all the claims (and,
        with ``batch_completion=True``, one for all the successes)."""
        prepared = [self._prepare(m) for m in messages]
        firsts, calls = _first_occurrences(prepared)
        claims = self._claim_many(calls)
        outcomes: list[Outcome | None] = []
        ran: list[_Ran] = []  # bodies that returned; their successes are written together
        for index, item in enumerate(prepared):
            if isinstance(item, Outcome):
                outcomes.append(item)
            elif index in firsts:
                claim = claims[firsts[index]]
                outcomes.append(self._after_batch_claim(index, item, claim, fn, ran))
            else:  # a later message of a scope: it must see its first one recorded
                self._record_successes(ran, outcomes)
                outcomes.append(self._claim_and_run(item, fn))
        self._record_successes(ran, outcomes)
        return [o for o in outcomes if o is not None]

    # ------------------------------------------------------------------ phases
    def _prepare(self, message: Message) -> _Prepared | Outcome:
        """Resolve and validate; invalid input is a ``"rejected"`` outcome (nothing ran)."""
        try:
            resolved = self.resolver.resolve(message)
            ttl, lease_timeout, max_retries, on_stuck = self._overrides
            call = self.handler.prepare(
                self.operation, resolved.tenant, resolved.key, resolved.payload,
                self.require_key, ttl, lease_timeout, max_retries, on_stuck,
            )
        except IdempotencyError as err:
            self.handler.log.warning(
                "message_rejected", operation=self.operation, error_code=err.code.value,
                error=err.message, topic=message.topic, offset=message.offset,
            )
            return Outcome("rejected", error_code=err.code, detail=err.message)
        return _Prepared(message, resolved, call)

    def _claim_and_run(self, prepared: _Prepared, fn: Body) -> Outcome:
        if prepared.call is None:
            return self._run_unkeyed(prepared, fn)
        try:
            claim = self.handler.claim(prepared.call)
        except IdempotencyError as err:
            return _refused(prepared.call, err)
        return self._after_claim(prepared, claim, fn)

    def _claim_many(self, calls: Sequence[Call]) -> list[Claim | IdempotencyError | None]:
        """One ``create_many`` for the first message of each scope; per scope the handler's
        decision on DUPLICATE (``None``: the record changed meanwhile — claim it again the
        single way)."""
        if not calls:
            return []
        handler = self.handler
        requests = [ClaimRequest(c.scope, c.request_hash, _new_token()) for c in calls]
        now = handler.clock()
        try:
            results = handler.store_call(
                "create_many", handler.store.create_many, requests, now=now,
                lease_expires_at=now + calls[0].options.lease_timeout,
            )
        except StoreUnavailableError as err:
            return [err for _ in calls]
        decided: list[Claim | IdempotencyError | None] = []
        for call, request, result in zip(calls, requests, results, strict=True):
            decided.append(self._decide(call, request, result))
        return decided

    def _decide(
        self, call: Call, request: ClaimRequest, result: Any
    ) -> Claim | IdempotencyError | None:
        if result.created:
            return Claim(request.token, 0, counted=False)
        try:
            return self.handler.decide_duplicate(call, result.record)
        except IdempotencyError as err:
            return err

    def _after_batch_claim(
        self,
        index: int,
        prepared: _Prepared,
        claim: Claim | IdempotencyError | None,
        fn: Body,
        ran: list[_Ran],
    ) -> Outcome | None:
        """The message's outcome, or ``None`` when its body returned and its success joins
        ``ran`` (written by ``_record_successes``)."""
        call = prepared.call
        assert call is not None
        if isinstance(claim, IdempotencyError):
            return _refused(call, claim)
        if claim is None:
            return self._claim_and_run(prepared, fn)
        if not claim.owned or not self.batch_completion:
            return self._after_claim(prepared, claim, fn)
        body = _BodyRun(fn, prepared.resolved.payload)
        try:
            result = self.handler.run_body(call, claim, body, self.permanent)
        except Exception as exc:
            return self._run_failed(call, claim, body, exc)
        ran.append(_Ran(index, call, claim, result))
        return None

    def _record_successes(self, ran: list[_Ran], outcomes: list[Outcome | None]) -> None:
        """One ``complete_many`` for the bodies that returned; fills their outcomes."""
        if not ran:
            return
        values = self.handler.complete_many([(r.call, r.token, r.result) for r in ran])
        for r, value in zip(ran, values, strict=True):
            outcomes[r.index] = (
                _refused(r.call, value, r.retry_count)
                if isinstance(value, IdempotencyError)
                else _outcome(r.call, "executed", result=value, retry_count=r.retry_count)
            )
        ran.clear()

    def _after_claim(self, prepared: _Prepared, claim: Claim, fn: Body) -> Outcome:
        call = prepared.call
        assert call is not None
        if not claim.owned:
            return _outcome(call, "replayed", result=claim.replay)
        body = _BodyRun(fn, prepared.resolved.payload)
        try:
            result = self._run_owned(call, claim, body)
        except Exception as exc:
            return self._run_failed(call, claim, body, exc)
        return _outcome(call, "executed", result=result, retry_count=claim.retry_count)

    def _run_failed(self, call: Call, claim: Claim, body: _BodyRun, exc: Exception) -> Outcome:
        """The outcome of an owned run that raised: the body's own error (already counted
        or poisoned by the handler) or a refusal of the library around it."""
        if body.error is exc:
            return self._body_failed(call, exc, claim.retry_count)
        if isinstance(exc, IdempotencyError):
            return _refused(call, exc, claim.retry_count)
        raise exc

    def _run_owned(self, call: Call, claim: Claim, body: _BodyRun) -> Any:
        """The handler's run phase for an owned scope (what ``execute`` does after claim)."""
        return self.handler.run_claimed(
            call, claim, body, self.permanent, transactional=self.transactional
        )

    def _body_failed(self, call: Call, exc: Exception, retry_count: int) -> Outcome:
        """The body raised; the handler has already counted/poisoned/released the scope."""
        error = type(exc).__name__
        detail = f"{error}: {exc}"[:500]
        if is_permanent(exc, self.permanent) or self._is_poisoned(call.scope, call.request_hash):
            return _outcome(
                call, "poisoned", error_code=ErrorCode.REQUEST_FAILED, error=error,
                detail=detail, retry_count=retry_count,
            )
        return _outcome(call, "failed", error=error, detail=detail, retry_count=retry_count)

    def _is_poisoned(self, scope: Scope, request_hash: str) -> bool:
        """Did this transient failure exhaust ``max_retries``?  One read, on failures only:
        ``on_body_error`` does not return what it decided.  If the store cannot say, the
        answer is "not yet": the message comes back and its redelivery finds FAILED."""
        try:
            record = self.handler.store_call("get", self.handler.store.get, scope)
        except IdempotencyError:
            return False
        return (
            record is not None
            and record.status is Status.FAILED
            and record.request_hash == request_hash
        )

    def _run_unkeyed(self, prepared: _Prepared, fn: Body) -> Outcome:
        """``require_key=False`` and no key: the handler runs the body without dedup."""
        body = _BodyRun(fn, prepared.resolved.payload)
        handler = self.handler
        try:
            if self.transactional:
                result = handler.execute_in_transaction(
                    body, operation=self.operation, tenant=prepared.resolved.tenant, key=None,
                    require_key=False,
                )
            else:
                result = handler.execute(
                    body, operation=self.operation, tenant=prepared.resolved.tenant, key=None,
                    require_key=False,
                )
        except Exception as exc:
            if body.error is not exc:
                raise
            kind: OutcomeKind = "poisoned" if is_permanent(exc, self.permanent) else "failed"
            return Outcome(kind, error=type(exc).__name__, detail=str(exc)[:500])
        return Outcome("executed", result=result)


def _first_occurrences(
    prepared: Sequence[_Prepared | Outcome],
) -> tuple[dict[int, int], list[Call]]:
    """The first message of each scope: message index → position in the batch claim, and
    the calls to claim in that order."""
    firsts: dict[int, int] = {}
    calls: list[Call] = []
    seen: set[Scope] = set()
    for index, item in enumerate(prepared):
        if isinstance(item, Outcome) or item.call is None or item.call.scope in seen:
            continue
        seen.add(item.call.scope)
        firsts[index] = len(calls)
        calls.append(item.call)
    return firsts, calls


def _outcome(
    call: Call,
    kind: OutcomeKind,
    *,
    result: Any = None,
    error_code: ErrorCode | None = None,
    error: str | None = None,
    detail: str | None = None,
    retry_count: int = 0,
) -> Outcome:
    return Outcome(
        kind, result=result, error_code=error_code, error=error, detail=detail,
        tenant=call.scope.tenant, key=call.scope.key, retry_count=retry_count,
    )


def _refused(call: Call, err: IdempotencyError, retry_count: int = 0) -> Outcome:
    """A refusal raised by the library (not by the body) as an outcome."""
    kind = _KIND_BY_CODE.get(err.code, "rejected")
    return _outcome(
        call, kind, error_code=err.code, detail=err.message, retry_count=retry_count
    )


__all__ = ["IdempotentConsumer"]
