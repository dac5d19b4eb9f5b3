"""The outcomes the algorithm answers with, built in one place (what each kind carries)."""

from __future__ import annotations

from typing import Any

from .engine import Call, Claim
from .errors import ErrorCode, IdempotencyError
from .outcome import Outcome, OutcomeKind, refusal_kind
from .records import IdempotencyContext

#: The code of an outcome whose body ran and that has no error of its own: a poisoned scope,
#: or a completion fenced off because a newer attempt is in progress.
_CODE_OF_KIND: dict[str, ErrorCode] = {
    "poisoned": ErrorCode.REQUEST_FAILED,
    "superseded": ErrorCode.REQUEST_IN_PROGRESS,
}


def replayed(call: Call, value: Any, token: int | None) -> Outcome:
    s = call.scope
    # positional, in Outcome's field order: built on every replay
    return Outcome(
        "replayed", value, None, None, None, None, s[0], s[1], s[2], 0, token,
        call.request_hash,
    )


def refused(
    call: Call, err: IdempotencyError, *, retry_count: int = 0, result: Any = None
) -> Outcome:
    """A refusal before any body ran (nothing was executed by this call); ``result`` is
    the value a poisoned scope keeps with its FAILED record, if any."""
    s = call.scope
    return Outcome(
        refusal_kind(err.code, ran=False), result=result, error_code=err.code,
        detail=err.message,
        tenant=s.tenant, operation=s.operation, key=s.key, retry_count=retry_count,
        request_hash=call.request_hash, refusal=err,
    )


def finished(
    call: Call,
    claim: Claim,
    ctx: IdempotencyContext,
    kind: OutcomeKind,
    *,
    result: Any = None,
    exc: BaseException | None = None,
    err: IdempotencyError | None = None,
    retry_count: int | None = None,
) -> Outcome:
    """The outcome of an attempt whose body ran (its context then says what happened).
    ``retry_count``, when the write told it, is the counter *after* this attempt was counted
    (a transient failure, the one that poisoned): the outcome and the context carry it;
    otherwise both keep the claim's count (a takeover's includes the crashed attempt)."""
    ctx.outcome = kind
    if retry_count is None:
        retry_count = claim.retry_count
    else:
        ctx.retry_count = retry_count
    s = call.scope
    error_code = err.code if err is not None else None
    if error_code is None and kind in _CODE_OF_KIND:
        error_code = _CODE_OF_KIND[kind]
    error = type(exc).__name__ if exc is not None else None
    detail = err.message if err is not None else (f"{error}: {exc}"[:500] if exc else None)
    if detail is None and kind == "superseded":
        detail = "a newer attempt took this scope over: its record answers"
    # positional, in Outcome's field order: built for every body that ran
    return Outcome(
        kind, result, error_code, error, detail, exc, s[0], s[1], s[2], retry_count,
        claim.token, call.request_hash, True, err, ctx,
    )


def not_recorded(
    call: Call,
    claim: Claim,
    ctx: IdempotencyContext,
    err: IdempotencyError,
    exc: BaseException | None = None,
) -> Outcome:
    """The body ran but its outcome is not written: the lease decides what comes next."""
    return finished(call, claim, ctx, refusal_kind(err.code, ran=True), exc=exc, err=err)

__all__ = ["finished", "not_recorded", "refused", "replayed"]
