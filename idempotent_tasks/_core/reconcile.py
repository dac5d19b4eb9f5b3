"""Reconciliation: ask the outside world before re-running a crashed attempt.

With ``on_stuck="reconcile"`` a delivery that finds its scope's lease expired (the owner
crashed, maybe after an effect outside the database and before its outcome was recorded)
takes the scope over — counting the crashed attempt, as ``"retry"`` does — and then calls
the operation's ``reconcile(ctx)`` *before* running the body again.  ``ctx`` is the new
attempt's context: the scope, its fencing token and ``ctx.derived_key(name)``, the key the
body gave the other service, to look the effect up there.  Its answer decides:

=============================  ==========================================================
``Reconciled.done(result)``    the effect happened: SUCCESS with ``result`` is recorded,
                               and this delivery (and every later one) gets it replayed
``Reconciled.not_done()``      it did not happen: the body runs now, as a takeover
``Reconciled.unknown(detail)`` nobody can tell (and so does an exception in
                               ``reconcile``): the record becomes UNCERTAIN — no automatic
                               re-run, every delivery gets ``OUTCOME_UNCERTAIN`` (409) with
                               the detail, until an operator resolves it
=============================  ==========================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .answers import refused, replayed
from .commands import Command, Runtime
from .context import CURRENT_CONTEXT
from .errors import ErrorCode, IdempotencyError
from .outcome import Outcome
from .records import IdempotencyContext
from .store_calls import MarkSuccess, MarkUncertain

if TYPE_CHECKING:
    from .engine import Call, Claim, Engine

_DETAIL_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What ``reconcile(ctx)`` found out about a crashed attempt's effects."""

    state: Literal["done", "not_done", "unknown"]
    result: Any = None
    detail: str = ""

    @classmethod
    def done(cls, result: Any = None) -> Reconciled:
        """The effect happened: record SUCCESS with ``result`` and replay it."""
        return cls("done", result=result)

    @classmethod
    def not_done(cls) -> Reconciled:
        """The effect did not happen: run the body as a takeover."""
        return cls("not_done")

    @classmethod
    def unknown(cls, detail: str) -> Reconciled:
        """Nobody can tell: park the scope as UNCERTAIN for an operator (``detail`` says
        why; duplicates get it with ``OUTCOME_UNCERTAIN``)."""
        return cls("unknown", detail=str(detail))


class AskReconcile(Command):
    """Call the user's ``reconcile(ctx)`` (awaited when it returns an awaitable), with the
    context bound as ``current_context()``; an exception is the answer "unknown"."""

    __slots__ = ("context", "fn")

    def __init__(self, fn: Callable[[IdempotencyContext], Any], context: IdempotencyContext):
        self.fn = fn
        self.context = context

    def sync(self, engine: Runtime) -> Reconciled:
        reset = CURRENT_CONTEXT.set(self.context)
        try:
            return _checked(self.fn(self.context))
        except Exception as exc:
            return Reconciled.unknown(f"reconcile raised {type(exc).__name__}: {exc}")
        finally:
            CURRENT_CONTEXT.reset(reset)

    async def run_async(self, engine: Runtime) -> Reconciled:
        reset = CURRENT_CONTEXT.set(self.context)
        try:
            answer = self.fn(self.context)
            if inspect.isawaitable(answer):
                answer = await answer
            return _checked(answer)
        except Exception as exc:
            return Reconciled.unknown(f"reconcile raised {type(exc).__name__}: {exc}")
        finally:
            CURRENT_CONTEXT.reset(reset)


def _checked(answer: Any) -> Reconciled:
    if not isinstance(answer, Reconciled):
        return Reconciled.unknown(f"reconcile returned {type(answer).__name__}, not Reconciled")
    return answer


def reconcile_takeover(
    engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext
) -> Generator[Command, Any, Claim | Outcome]:
    """After taking a crashed attempt over: ask ``reconcile``; the claim (run the body), or
    the outcome its answer recorded."""
    fn = call.options.reconcile
    assert fn is not None
    answer: Reconciled = yield AskReconcile(fn, ctx)
    fields = call.fields()
    if answer.state == "not_done":
        engine.log.info("reconciled_not_done", status="PROCESSING", **fields)
        return claim
    try:
        if answer.state == "done":
            return (yield from _done(engine, call, claim, answer.result))
        detail = answer.detail[:_DETAIL_LIMIT]
        marked = yield MarkUncertain(call.scope, claim.token, engine.clock(), detail.encode())
    except IdempotencyError as err:
        return refused(call, err, retry_count=claim.retry_count)
    if not marked:
        return refused(call, call.error(
            ErrorCode.REQUEST_IN_PROGRESS, "a newer attempt owns this scope"
        ), retry_count=claim.retry_count)
    uncertain = getattr(engine.metrics, "uncertain", None)
    if uncertain is not None:
        uncertain(call.scope.operation)
    engine.log.warning("marked_uncertain", status="UNCERTAIN", detail=detail, **fields)
    return refused(call, call.error(
        ErrorCode.OUTCOME_UNCERTAIN, f"uncertain: {detail}"
    ), retry_count=claim.retry_count)


def _done(
    engine: Engine, call: Call, claim: Claim, result: Any
) -> Generator[Command, Any, Outcome]:
    encoded = engine.encode_response(call, result)  # RESPONSE_NOT_SERIALIZABLE: refused
    now = engine.clock()
    ok = yield MarkSuccess(call.scope, claim.token, encoded, now, now + call.options.ttl)
    if not ok:
        return refused(call, call.error(
            ErrorCode.REQUEST_IN_PROGRESS, "a newer attempt owns this scope"
        ), retry_count=claim.retry_count)
    engine.log.info("reconciled_done", status="SUCCESS", **call.fields())
    outcome = replayed(call, engine._loads(encoded), claim.token)
    outcome.retry_count = claim.retry_count  # the crashed attempt counted
    return outcome


__all__ = ["AskReconcile", "Reconciled", "reconcile_takeover"]
