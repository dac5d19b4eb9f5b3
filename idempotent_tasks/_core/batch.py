"""A batch of calls with one claim round trip (``handler.run_many``).

Every distinct scope of the batch is claimed with **one** ``create_many``; the bodies then
run in order, each outcome recorded as its body ends — or, with ``batch_completion=True``,
the successes together after the bodies with **one** ``mark_success_many``.  Per call the
outcome is the one ``run`` would give when the calls are run one after another: a DUPLICATE
from the batch claim goes through the same decision as a single claim, and a scope that
occurs twice in one batch is claimed by its first occurrence only — the later ones are run
as single calls after the first one is recorded.  A crash mid-batch leaves every claimed
scope PROCESSING that was not recorded yet; each lease then expires and the takeover counts
one attempt per such call.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ..stores.base import ClaimRequest, SuccessWrite
from ..typing import Permanent
from . import tracing
from .answers import not_recorded, refused
from .commands import Command, RunBody
from .engine import Call, Claim, Engine
from .errors import IdempotencyError
from .flow import body_context, claim_scope, decide_io, lease_of, run_owned, unkeyed
from .outcome import Outcome
from .recording import body_failed, recorded, succeeded, unstorable, write_outcome
from .records import IdempotencyContext, Scope
from .store_calls import CreateMany, MarkSuccessMany
from .transactional import (
    execute_in_transaction,
    run_owned_in_transaction,
    unkeyed_in_transaction,
)

Body = Callable[..., Any]


@dataclass(slots=True)
class Entry:
    """One call of the batch: what it was given, and its validated form (``call`` is
    ``None`` for an unkeyed call) — or the ``rejected`` outcome its input earned."""

    item: Any
    operation: str
    call: Call | None


@dataclass(slots=True)
class Mode:
    permanent: Permanent
    transactional: bool
    batch_completion: bool
    #: One span per call while tracing is on (``None``: off).
    spans: tracing.BatchSpans | None = None


@dataclass(slots=True)
class _Ran:
    """A body that returned; its success is not written yet (``batch_completion``)."""

    index: int
    call: Call
    claim: Claim
    ctx: IdempotencyContext
    value: Any


def execute_many(
    engine: Engine, entries: Sequence[Entry | Outcome], fn: Body, mode: Mode
) -> Generator[Command, Any, list[Outcome]]:
    firsts, calls = _first_occurrences(entries)
    claims = yield from _claim_many(engine, calls)
    outcomes: list[Outcome | None] = [None] * len(entries)
    pending: list[_Ran] = []
    spans = mode.spans
    for index, entry in enumerate(entries):
        if isinstance(entry, Outcome):
            outcomes[index] = entry
            if spans is not None:
                spans.finish(index, entry)
            continue
        decided = claims[firsts[index]] if entry.call is not None and index in firsts else None
        if spans is None:
            outcome = yield from _turn(engine, index, entry, decided, fn, mode, pending, outcomes)
        else:  # the call's span is current while its body runs and its outcome is written
            spans.enter(index, entry.operation)
            try:
                outcome = yield from _turn(
                    engine, index, entry, decided, fn, mode, pending, outcomes
                )
            finally:
                spans.leave()
            if outcome is not None:
                spans.finish(index, outcome)
        outcomes[index] = outcome
    yield from _record_successes(engine, pending, outcomes, spans)
    return [o for o in outcomes if o is not None]


def _turn(
    engine: Engine,
    index: int,
    entry: Entry,
    decided: Claim | Outcome | None,
    fn: Body,
    mode: Mode,
    pending: list[_Ran],
    outcomes: list[Outcome | None],
) -> Generator[Command, Any, Outcome | None]:
    """One call of the batch, given what the batch claim decided for it (``None``: it is
    unkeyed, its scope was seen earlier in the batch, or it must be claimed again)."""
    if isinstance(decided, Claim):
        return (yield from _run_claimed(engine, index, entry, decided, fn, mode, pending))
    if decided is not None:
        return decided  # a replay or a refusal
    yield from _record_successes(engine, pending, outcomes, mode.spans)
    return (yield from _run_single(engine, entry, fn, mode))


def _first_occurrences(
    entries: Sequence[Entry | Outcome],
) -> tuple[dict[int, int], list[Call]]:
    """The first call of each scope: entry index → position in the batch claim."""
    firsts: dict[int, int] = {}
    calls: list[Call] = []
    seen: set[Scope] = set()
    for index, entry in enumerate(entries):
        if isinstance(entry, Outcome) or entry.call is None or entry.call.scope in seen:
            continue
        seen.add(entry.call.scope)
        firsts[index] = len(calls)
        calls.append(entry.call)
    return firsts, calls


def _claim_many(
    engine: Engine, calls: Sequence[Call]
) -> Generator[Command, Any, list[Claim | Outcome | None]]:
    """One ``create_many``; per scope a ``Claim``, the decision on its DUPLICATE, or
    ``None`` — the store could not say for sure: claim it again as a single call."""
    if not calls:
        return []
    now = engine.clock()
    # One lease for the batch: the longest asked for (a shorter one could expire while
    # a body of the batch still runs).
    lease = max(c.options.lease_timeout for c in calls)
    requests = [ClaimRequest(c.scope, c.request_hash) for c in calls]
    try:
        results = yield CreateMany(requests, now, now + lease)
    except IdempotencyError as err:
        return [refused(call, err) for call in calls]
    decided: list[Claim | Outcome | None] = []
    for call, result in zip(calls, results, strict=True):
        if result is None:
            decided.append(None)
        elif result.created:
            decided.append(Claim(result.record.fencing_token, 0, counted=False))
        else:
            decided.append((yield from decide_io(engine, call, result.record)))
    return decided


def _run_single(
    engine: Engine, entry: Entry, fn: Body, mode: Mode
) -> Generator[Command, Any, Outcome]:
    item, call = entry.item, entry.call
    if mode.transactional:
        body = _bind_tx(fn, item)
        if call is None:
            return (yield from unkeyed_in_transaction(
                engine, entry.operation, body, mode.permanent
            ))
        return (yield from execute_in_transaction(engine, call, body, mode.permanent))
    if call is None:
        return (yield from unkeyed(engine, entry.operation, _bind(fn, item), mode.permanent))
    claim = yield from claim_scope(engine, call)
    if not isinstance(claim, Claim):
        return claim
    return (yield from run_owned(engine, call, claim, _bind(fn, item), mode.permanent))


def _run_claimed(
    engine: Engine,
    index: int,
    entry: Entry,
    claim: Claim,
    fn: Body,
    mode: Mode,
    pending: list[_Ran],
) -> Generator[Command, Any, Outcome | None]:
    """Run an owned scope's body; ``None`` when its success joins ``pending``."""
    call = entry.call
    assert call is not None
    if mode.transactional:
        return (yield from run_owned_in_transaction(
            engine, call, claim, _bind_tx(fn, entry.item), mode.permanent
        ))
    if not mode.batch_completion:
        return (yield from run_owned(engine, call, claim, _bind(fn, entry.item), mode.permanent))
    ctx = body_context(engine, call, claim)
    try:
        value = yield RunBody(_bind(fn, entry.item), (), ctx, lease_of(engine, call, claim))
    except BaseException as exc:
        return (yield from body_failed(engine, call, claim, ctx, exc, mode.permanent))
    pending.append(_Ran(index, call, claim, ctx, value))
    return None


def _record_successes(
    engine: Engine,
    pending: list[_Ran],
    outcomes: list[Outcome | None],
    spans: tracing.BatchSpans | None = None,
) -> Generator[Command, Any, None]:
    """One ``mark_success_many`` for the bodies that returned; fills their outcomes (and
    ends their spans)."""
    if not pending:
        return
    ran = list(pending)
    pending.clear()
    yield from _write_successes(engine, ran, outcomes, spans)
    if spans is not None:
        for r in ran:
            outcome = outcomes[r.index]
            if outcome is not None:
                spans.finish(r.index, outcome)


def _write_successes(
    engine: Engine,
    ran: list[_Ran],
    outcomes: list[Outcome | None],
    spans: tracing.BatchSpans | None,
) -> Generator[Command, Any, None]:
    now = engine.clock()
    writes: list[tuple[_Ran, SuccessWrite, bytes]] = []
    for r in ran:
        try:
            encoded = engine.encode_response(r.call, r.value)
        except IdempotencyError as err:
            outcomes[r.index] = yield from unstorable(engine, r.call, r.claim, r.ctx, err)
            continue
        stored = encoded if spans is None else tracing.wrap(encoded, spans.traceparent(r.index))
        write = SuccessWrite(r.call.scope, r.claim.token, stored, now + r.call.options.ttl)
        writes.append((r, write, encoded))
    if not writes:
        return
    try:
        written = yield from write_outcome(
            engine, writes[0][0].call, MarkSuccessMany([w for _, w, _ in writes], now)
        )
    except IdempotencyError as err:  # OUTCOME_NOT_RECORDED: the whole write failed
        for r, _, _ in writes:
            own = r.call.error(err.code, err.message)
            outcomes[r.index] = not_recorded(r.call, r.claim, r.ctx, own)
        return
    for (r, w, encoded), ok in zip(writes, written, strict=True):
        if ok and engine.cache is None:  # the common case: nothing more to write
            outcomes[r.index] = recorded(engine, r.call, r.claim, r.ctx, encoded)
        else:
            outcomes[r.index] = yield from succeeded(
                engine, r.call, r.claim, r.ctx, w.response, ok, now
            )


def _bind(fn: Body, item: Any) -> Callable[[], Any]:
    return lambda: fn(item)


def _bind_tx(fn: Body, item: Any) -> Callable[[Any], Any]:
    return lambda conn: fn(item, conn)


__all__ = ["Entry", "Mode", "execute_many"]
