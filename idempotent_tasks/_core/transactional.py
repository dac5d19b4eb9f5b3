"""Exactly-once effects in one transaction: the body's writes commit with its SUCCESS.

The claim commits first in its own short transaction (``claim_scope``), so concurrent
duplicates see PROCESSING.  The body then runs inside one transaction that also performs the
conditional SUCCESS update (status PROCESSING and our fencing token); both commit together.
A crash, an exception or a lost lease rolls the body's writes back with it.  Counters,
releases and poisoning are written in their own transactions *after* the rollback, so a
rollback never erases a counted failure.  A stale owner (its final update matched no row)
rolls back and answers as a duplicate would: its own result's effects no longer exist.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

from ..typing import Permanent
from . import tracing
from .answers import finished, refused
from .commands import Command, RunBody, TxBegin, TxCall, TxEnd
from .engine import Call, Claim, Engine
from .errors import ErrorCode, IdempotencyError
from .flow import Flow, body_context, claim_scope, decide, lease_of
from .outcome import Outcome, OutcomeKind, refusal_kind
from .policies import announce
from .recording import body_failed, is_permanent, poison, unstorable
from .records import IdempotencyContext
from .steps import BodyContext
from .store_calls import Get, Release
from .transaction_context import bound_to_transaction


def execute_in_transaction(
    engine: Engine, call: Call, fn: Callable[[Any], Any], permanent: Permanent
) -> Flow:
    """Claim, then run ``fn(conn)`` in the store's transaction with the conditional SUCCESS."""
    claim = yield from claim_scope(engine, call)
    if not isinstance(claim, Claim):
        return claim
    return (yield from run_owned_in_transaction(engine, call, claim, fn, permanent))


def run_owned_in_transaction(
    engine: Engine, call: Call, claim: Claim, fn: Callable[[Any], Any], permanent: Permanent
) -> Flow:
    """``fn(conn)`` for a scope we own, in one transaction with the conditional SUCCESS."""
    try:
        cm, tx = yield TxBegin()
    except IdempotencyError as err:
        with contextlib.suppress(IdempotencyError):  # else the lease expires; recovery decides
            yield Release(call.scope, claim.token)
        return refused(call, err)
    error: BaseException | None = None
    try:
        outcome = yield from _in_transaction(engine, call, claim, tx, fn, permanent)
    except BaseException as exc:
        error = exc
        raise
    finally:
        yield TxEnd(cm, error)
    if call.options.on_in_progress == "wait":  # committed: duplicates may wait for it
        yield from announce(engine, call)
    return outcome


def _in_transaction(
    engine: Engine, call: Call, claim: Claim, tx: Any, fn: Callable[[Any], Any],
    permanent: Permanent,
) -> Flow:
    ctx = body_context(engine, call, claim)
    if isinstance(ctx, BodyContext):
        ctx.refuse_steps(
            "steps are for effects outside the database; a transactional body's writes are "
            "exactly-once already (pass ctx.derived_key(name) to external calls instead)"
        )
    try:
        body = bound_to_transaction(fn, engine)  # current_outbox() reaches tx.connection
        value = yield RunBody(body, (tx.connection,), ctx, lease_of(engine, call, claim))
    except BaseException as exc:
        yield TxCall(tx, "rollback")  # every failure rolls back *before* it is recorded
        return (yield from body_failed(engine, call, claim, ctx, exc, permanent))
    if not tx.is_intact():
        yield TxCall(tx, "rollback")
        return (yield from _ended_by_body(engine, call, claim, ctx))
    try:
        encoded = engine.encode_response(call, value)
    except IdempotencyError as err:
        yield TxCall(tx, "rollback")
        return (yield from unstorable(engine, call, claim, ctx, err))
    now = engine.clock()
    try:
        ok = yield TxCall(
            tx, "mark_success", call.scope, token=claim.token,
            response=tracing.stored_form(encoded), now=now, expires_at=now + call.options.ttl,
        )
        if not ok:
            yield TxCall(tx, "rollback")
            engine.lease_lost(call)
            return (yield from _as_duplicate(engine, call, claim, ctx))
        yield TxCall(tx, "commit")
    except IdempotencyError as err:
        # The commit may or may not have happened: the lease decides.
        not_recorded = call.error(
            ErrorCode.OUTCOME_NOT_RECORDED,
            f"the body's transaction did not commit: {err.message}",
        )
        not_recorded.__cause__ = err
        return finished(call, claim, ctx, "store_unavailable", err=not_recorded)
    engine.metrics.execution(call.scope.operation, "success")
    engine.debug("executed", call, status="SUCCESS", transactional=True)
    return finished(call, claim, ctx, "executed", result=engine.serializer.loads(encoded))


def _ended_by_body(engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext) -> Flow:
    """The body committed or rolled back the shared transaction itself: a programming
    error, and its effects may already be committed — poison the scope."""
    err = call.error(
        ErrorCode.CONFIGURATION_ERROR,
        "the body committed or rolled back the shared transaction itself",
    )
    try:
        yield from poison(engine, call, claim.token, reason="body_ended_transaction")
    except IdempotencyError as not_recorded:
        return finished(
            call, claim, ctx, refusal_kind(not_recorded.code, ran=True), err=not_recorded
        )
    return finished(call, claim, ctx, "poisoned", err=err)


def _as_duplicate(engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext) -> Flow:
    """A stale owner's effects were rolled back: answer as a duplicate would (the flow's
    own decision on the record as it is now), never with our own result."""
    try:
        record = yield Get(call.scope)
    except IdempotencyError as err:
        return finished(call, claim, ctx, refusal_kind(err.code, ran=True), err=err)
    decided = decide(engine, call, record)
    if type(decided) is not Outcome or decided.kind not in ("replayed", "poisoned"):
        busy = call.error(ErrorCode.REQUEST_IN_PROGRESS, "another attempt owns this scope")
        return finished(call, claim, ctx, "in_progress", err=busy)
    outcome = finished(call, claim, ctx, decided.kind, result=decided.result,
                       err=decided.refusal)
    outcome.replayed_from = decided.replayed_from
    return outcome


def unkeyed_in_transaction(
    engine: Engine, operation: str, fn: Callable[[Any], Any], permanent: Permanent
) -> Generator[Command, Any, Outcome]:
    """``require_key=False`` and no key: the body in a transaction, without deduplication."""
    engine.unkeyed(operation)
    try:
        cm, tx = yield TxBegin()
    except IdempotencyError as err:
        return Outcome(
            refusal_kind(err.code, ran=False), error_code=err.code, detail=err.message,
            operation=operation, refusal=err,
        )
    error: BaseException | None = None
    try:
        value = yield RunBody(fn, (tx.connection,), None, None)
        yield TxCall(tx, "commit")
    except Exception as exc:
        error = exc
        kind: OutcomeKind = "poisoned" if is_permanent(exc, permanent) else "failed"
        return Outcome(
            kind, error=type(exc).__name__, detail=f"{type(exc).__name__}: {exc}"[:500],
            exception=exc, operation=operation, ran=True,
        )
    except BaseException as exc:
        error = exc
        raise
    finally:
        yield TxEnd(cm, error)
    return Outcome("executed", result=value, operation=operation, ran=True)


__all__ = ["execute_in_transaction", "run_owned_in_transaction", "unkeyed_in_transaction"]
