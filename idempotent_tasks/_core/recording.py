"""Recording what a body did (step 5 of the algorithm): SUCCESS, poison, or count and release.

Every write here happens after the body ran, so it is retried with bounded backoff before
it gives up with OUTCOME_NOT_RECORDED; every write is conditional on the record being
PROCESSING with our fencing token, so a stale owner never overwrites a newer attempt.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator
from typing import Any

from ..typing import Permanent
from . import store_calls as sc
from . import tracing
from .answers import finished, not_recorded
from .caching import cache_put
from .commands import Command, Sleep
from .engine import Call, Claim, Engine
from .errors import ErrorCode, IdempotencyError, StoreUnavailableError
from .outcome import Outcome, OutcomeKind
from .records import IdempotencyContext
from .signals import Abandon, Poison, Release
from .tracing import API as _OTEL

Flow = Generator[Command, Any, Outcome]
Step = Generator[Command, Any, Any]


def complete(
    engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext, value: Any
) -> Flow:
    """Record a body's result (step 5): SUCCESS, conditional on status and our token.  While
    tracing is on, the record keeps the traceparent of this execution's span."""
    try:
        encoded = engine.encode_response(call, value)
    except IdempotencyError as err:  # the body ran: it must never run again
        return (yield from unstorable(engine, call, claim, ctx, err))
    command = success_write(engine, call, claim, encoded)
    try:
        stored = yield command
    except IdempotencyError as exc:
        return (yield from success_not_written(engine, call, claim, ctx, command, exc))
    if stored and engine.cache is None:  # the common case: nothing more to write
        return recorded(engine, call, claim, ctx, encoded)
    return (yield from succeeded(engine, call, claim, ctx, command.response, stored, command.now))


def success_write(engine: Engine, call: Call, claim: Claim, encoded: bytes) -> sc.MarkSuccess:
    """The SUCCESS write of ``encoded``, conditional on our token (with this execution's
    traceparent while tracing is on)."""
    now = engine.clock()
    stored_form = encoded if _OTEL._TRACER_PROVIDER is None else tracing.stored_form(encoded)
    return sc.MarkSuccess(call.scope, claim.token, stored_form, now, now + call.options.ttl)


def success_not_written(
    engine: Engine,
    call: Call,
    claim: Claim,
    ctx: IdempotencyContext,
    command: sc.MarkSuccess,
    exc: IdempotencyError,
) -> Flow:
    """The SUCCESS write failed: retried with bounded backoff while the store is
    unavailable, then written as it is or OUTCOME_NOT_RECORDED."""
    if not isinstance(exc, StoreUnavailableError):
        return not_recorded(call, claim, ctx, exc)
    try:
        stored = yield from _retry_outcome(engine, call, command, exc)
    except IdempotencyError as err:
        return not_recorded(call, claim, ctx, err)
    return (yield from succeeded(engine, call, claim, ctx, command.response, stored, command.now))


def recorded(
    engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext, encoded: bytes
) -> Outcome:
    """A SUCCESS that is written: the replayable value (the serializer's round trip, as a
    replay will return it), metrics and log."""
    engine.metrics.execution(call.scope.operation, "success")
    if engine.debug_enabled():  # engine.debug, inlined: a frame less on every execution
        engine.log.debug("executed", status="SUCCESS", **call.fields())
    return finished(call, claim, ctx, "executed", result=engine._loads(encoded))


def succeeded(
    engine: Engine,
    call: Call,
    claim: Claim,
    ctx: IdempotencyContext,
    stored_form: bytes,
    stored: bool,
    now: float,
) -> Flow:
    """After the SUCCESS write of ``stored_form`` (``stored`` False: it was refused): the
    replayable value, metrics, log and cache."""
    encoded, _ = tracing.unwrap(stored_form)
    if not stored:
        adopted = yield from _adopt_success(engine, call, stored_form)
        if not adopted:
            engine.lease_lost(call)
            return finished(call, claim, ctx, "superseded", result=engine._loads(encoded))
    outcome = recorded(engine, call, claim, ctx, encoded)
    if engine.cache is not None:
        yield from cache_put(engine, call, stored_form, now + call.options.ttl)
    return outcome


def _adopt_success(
    engine: Engine, call: Call, stored_form: bytes
) -> Generator[Command, Any, bool]:
    """Our SUCCESS write was refused.  If no attempt owns the scope any more — recovery
    released it while we were paused past our lease — the body that really ran is ours:
    claim the scope afresh and record its outcome, so that no redelivery runs it again.
    If another attempt holds it (a takeover), we are truly stale: write nothing."""
    now = engine.clock()
    try:
        claimed = yield from write_outcome(engine, call, sc.Create(
            call.scope, call.request_hash, now, now + call.options.lease_timeout
        ))
        if not claimed.created:
            return False
        stored: bool = yield from write_outcome(engine, call, sc.MarkSuccess(
            call.scope, claimed.record.fencing_token, stored_form, now, now + call.options.ttl
        ))
    except IdempotencyError:
        return False  # logged by the wrapper; the lease decides
    if stored:
        engine.log.warning("released_scope_adopted", status="SUCCESS", **call.fields())
    return stored


def unstorable(
    engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext, err: IdempotencyError
) -> Flow:
    """A result that cannot be serialised: poison the scope (the body already ran)."""
    try:
        yield from poison(engine, call, claim.token, reason="response_not_serializable")
    except IdempotencyError as unwritten:
        return not_recorded(call, claim, ctx, unwritten)
    return finished(call, claim, ctx, "poisoned", err=err)


def body_failed(
    engine: Engine,
    call: Call,
    claim: Claim,
    ctx: IdempotencyContext,
    exc: BaseException,
    permanent: Permanent,
) -> Flow:
    """The body raised: a permanent error poisons (keeping a :class:`Poison`'s value with
    the record); :class:`Release` is counted like a transient error (``counted=False``:
    released without counting); any other (transient) error
    is counted and releases the scope, or poisons at ``max_retries``.  A ``BaseException``
    that is not an ``Exception`` is recorded the same way, then propagates — except
    :class:`Abandon`, which writes nothing (the claim stays as a killed worker leaves it)."""
    if isinstance(exc, Abandon):
        raise exc
    kept = kept_value(engine, call, exc)
    try:
        kind, count = yield from record_failure(engine, call, claim.token, exc, permanent, kept)
    except IdempotencyError as err:  # OUTCOME_NOT_RECORDED, or a schema part missing
        if err.code is ErrorCode.CONFIGURATION_ERROR:
            # the failure cannot be recorded (e.g. the counter table is gone): release the
            # claim, so the next delivery is not refused as in progress for a whole lease
            with contextlib.suppress(IdempotencyError):
                yield sc.Release(call.scope, claim.token)
        outcome = not_recorded(call, claim, ctx, err, exc)
    else:
        outcome = finished(
            call, claim, ctx, kind, exc=exc,
            result=engine.serializer.loads(kept) if kept is not None else None,
            retry_count=claim.retry_count if count is None else count,
        )
    if not isinstance(exc, Exception):
        raise exc
    return outcome


def kept_value(engine: Engine, call: Call, exc: BaseException) -> bytes | None:
    """The encoded value a :class:`Poison` keeps with its FAILED record; ``None`` for any
    other exception, or when the value cannot be stored (the scope is poisoned without)."""
    if not isinstance(exc, Poison) or exc.value is None:
        return None
    try:
        return engine.encode_response(call, exc.value)
    except IdempotencyError as err:
        engine.log.warning("poison_value_not_stored", detail=err.message, **call.fields())
        return None


def record_failure(
    engine: Engine,
    call: Call,
    token: int,
    exc: BaseException,
    permanent: Permanent,
    kept: bytes | None = None,
) -> Generator[Command, Any, tuple[OutcomeKind, int | None]]:
    """Write what a failed body means; returns the kind and the counter (``None``: not read).
    Raises OUTCOME_NOT_RECORDED when the store stays away."""
    error = type(exc).__name__
    if isinstance(exc, Release) and not exc.counted:
        released = yield from release_uncounted(engine, call, token, exc)
        return ("failed" if released else "superseded"), None
    if is_permanent(exc, permanent):
        engine.metrics.execution(call.scope.operation, "permanent_failure")
        poisoned = yield from poison(
            engine, call, token, reason="permanent_failure", error=error, cause=exc,
            response=kept,
        )
        return ("poisoned" if poisoned else "superseded"), None
    engine.metrics.execution(call.scope.operation, "transient_failure")
    now = engine.clock()
    result = yield from write_outcome(engine, call, sc.RecordFailure(
        call.scope, token, now, call.options.max_retries, now + call.options.ttl
    ), cause=exc)
    if result is None:  # another attempt owns the scope: nothing was counted
        engine.lease_lost(call)
        return "superseded", None
    if result.poisoned:
        engine.metrics.poisoned(call.scope.operation)
        engine.log.warning(
            "poisoned", status="FAILED", reason="retries_exhausted",
            retry_count=result.retry_count, error=error, **call.fields(),
        )
        return "poisoned", result.retry_count
    engine.log.info(
        "released_for_retry", status="RELEASED", retry_count=result.retry_count, error=error,
        **call.fields(),
    )
    return "failed", result.retry_count


def release_uncounted(
    engine: Engine, call: Call, token: int, exc: Release
) -> Generator[Command, Any, bool]:
    """A :class:`Release`: delete our PROCESSING record, counter untouched (the attempt
    was not the operation's outcome).  Counted as a transient failure in the metrics (the
    body ran and the scope is free for a retry), never in the scope's retry counter.  False
    (and ``lease_lost``) when another attempt owns the scope."""
    engine.metrics.execution(call.scope.operation, "transient_failure")
    released = yield from write_outcome(engine, call, sc.Release(call.scope, token), cause=exc)
    if not released:
        engine.lease_lost(call)
        return False
    engine.log.info(
        "released_uncounted", status="RELEASED", reason=exc.reason, **call.fields()
    )
    return True


def poison(
    engine: Engine,
    call: Call,
    token: int,
    *,
    reason: str,
    error: str | None = None,
    cause: BaseException | None = None,
    response: bytes | None = None,
) -> Generator[Command, Any, bool]:
    """Mark our attempt FAILED (keeping ``response`` with it when given); False (and
    ``lease_lost``) when another attempt owns it."""
    now = engine.clock()
    command = sc.MarkFailed(call.scope, token, now, now + call.options.ttl, response=response)
    ok = yield from write_outcome(engine, call, command, cause=cause)
    if not ok:
        engine.lease_lost(call)
        return False
    engine.metrics.poisoned(call.scope.operation)
    engine.log.warning(
        "poisoned", status="FAILED", reason=reason, error=error,
        kept_response=response is not None, **call.fields(),
    )
    return True


def is_permanent(exc: BaseException, permanent: Permanent) -> bool:
    """A configuration error and a :class:`Poison` always are; a :class:`Release` never."""
    if isinstance(exc, Poison):
        return True
    if isinstance(exc, Release):
        return False
    if isinstance(exc, IdempotencyError) and exc.code is ErrorCode.CONFIGURATION_ERROR:
        return True
    if callable(permanent) and not isinstance(permanent, tuple):
        return bool(permanent(exc))
    return bool(permanent) and isinstance(exc, permanent)


def write_outcome(
    engine: Engine,
    call: Call,
    command: sc.StoreCall,
    *,
    cause: BaseException | None = None,
) -> Step:
    """A write after the body ran (``command``): retried with bounded backoff, then
    OUTCOME_NOT_RECORDED."""
    try:
        return (yield command)
    except StoreUnavailableError as exc:
        return (yield from _retry_outcome(engine, call, command, exc, cause))


def _retry_outcome(
    engine: Engine,
    call: Call,
    command: sc.StoreCall,
    failed: StoreUnavailableError,
    cause: BaseException | None = None,
) -> Step:
    deadline = time.monotonic() + engine.outcome_retry_timeout
    delay = 0.05
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            engine.log.error("outcome_not_recorded", call=command.name, **call.fields())
            err = call.error(
                ErrorCode.OUTCOME_NOT_RECORDED,
                f"the body ran but its outcome could not be written: {failed.message}",
            )
            raise err from (cause or failed)
        yield Sleep(min(delay, remaining))
        delay = min(delay * 2, 2.0)
        try:
            return (yield command)
        except StoreUnavailableError as exc:
            failed = exc


__all__ = [
    "body_failed",
    "complete",
    "is_permanent",
    "kept_value",
    "poison",
    "record_failure",
    "release_uncounted",
    "succeeded",
    "unstorable",
    "write_outcome",
]
