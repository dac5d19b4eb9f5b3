"""The execution algorithm, written once: validate → claim → decide → run → record.

Every function here is a generator that ``yield``s :mod:`.commands` (store calls, the body,
a backoff sleep) and returns an :class:`~.outcome.Outcome`; :mod:`.drivers` runs it on the
synchronous path or on an event loop, and :mod:`.transactional` / :mod:`.batch` reuse its
steps.  Expected results are values: a refusal is an ``Outcome``, never an exception; only a
``BaseException`` out of a body (``KeyboardInterrupt``, a cancelled task) propagates, after
its attempt was recorded (``Abandon`` propagates with nothing recorded: a simulated crash).

The steps, for one delivery of a scope:

1. Cache look-up of a SUCCESS (failures are swallowed, counted, logged).
2. ``create`` — atomic; exactly one concurrent caller gets CREATED, with a fencing token
   greater than every earlier attempt's of the scope.
3. On DUPLICATE, decide: another payload → KEY_REUSED; SUCCESS → replay; FAILED →
   REQUEST_FAILED; PROCESSING with a live lease → REQUEST_IN_PROGRESS; an expired lease →
   take over (counting the crashed attempt) or poison, as ``on_stuck`` says.
4. Run the body (its context bound, its lease renewed by the heartbeat).
5. Record: SUCCESS conditional on status and token; a permanent error poisons; a transient
   one is counted and releases the scope (or poisons at ``max_retries``).  Writes after the
   body ran are retried with bounded backoff, then OUTCOME_NOT_RECORDED.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

from ..typing import Permanent
from . import policies
from .answers import refused, replayed
from .caching import cache_put, cached
from .commands import Command, RunBody
from .engine import Call, Claim, Engine
from .errors import ErrorCode, IdempotencyError
from .heartbeat import Lease
from .outcome import Outcome, OutcomeKind
from .reconcile import reconcile_takeover
from .recording import body_failed, complete, is_permanent, write_outcome
from .records import CREATED, SUCCESS, IdempotencyContext, Status, StoredRecord
from .serialization import SerializationError
from .steps import BodyContext
from .store_calls import Create, Get, GetRetryCount, MarkFailed, TakeOverCall
from .tracing import unwrap

Flow = Generator[Command, Any, Outcome]

_MAX_CLAIM_ROUNDS = 8


# ---------------------------------------------------------------------- one delivery
def execute(
    engine: Engine,
    call: Call,
    fn: Callable[[], Any],
    permanent: Permanent,
    claim: Claim | None = None,
) -> Flow:
    """The whole algorithm for a plain (non-transactional) body ``fn()`` — or, given the
    ``claim`` of a scope we own already, steps 4 and 5 only.

    One generator on purpose: every delivery runs it, and each nested generator costs a
    frame resumption per command.  What is rare (duplicates, failures, outcome-write
    retries, the cache) is delegated to the functions below and in :mod:`.recording`."""
    if claim is None:
        if engine.cache is None:
            try:
                result = yield create_command(engine, call)
            except IdempotencyError as err:
                return refused(call, err)
            if result.outcome is CREATED:
                claimed: Claim | Outcome = Claim(result.record.fencing_token, 0, counted=False)
            else:
                decided = decide(engine, call, result.record)
                if type(decided) is Outcome and decided.kind != "poisoned":
                    return decided  # a replay or a refusal: no more I/O
                claimed = yield from claim_existing(engine, call, result.record, decided)
        else:
            claimed = yield from claim_scope(engine, call)
        if not isinstance(claimed, Claim):
            return claimed
        claim = claimed
    ctx = body_context(engine, call, claim)
    lease = None if engine.heartbeat is None else lease_of(engine, call, claim)
    try:
        value = yield RunBody(fn, (), ctx, lease)
    except BaseException as exc:
        outcome = yield from body_failed(engine, call, claim, ctx, exc, permanent)
    else:
        outcome = yield from complete(engine, call, claim, ctx, value)
    if call.options.on_in_progress == "wait":  # duplicates may wait for this outcome
        yield from policies.announce(engine, call)
    return outcome


def run_owned(
    engine: Engine, call: Call, claim: Claim, fn: Callable[[], Any], permanent: Permanent
) -> Flow:
    """Run the body of a scope we own and record its outcome (steps 4 and 5)."""
    return (yield from execute(engine, call, fn, permanent, claim))


def create_command(engine: Engine, call: Call) -> Create:
    """The claim (step 2): one atomic ``create``."""
    now = engine.clock()
    return Create(call.scope, call.request_hash, now, now + call.options.lease_timeout)


def claim_scope(engine: Engine, call: Call) -> Generator[Command, Any, Claim | Outcome]:
    """Own the scope (a :class:`Claim`), or the outcome that answers this delivery."""
    if engine.cache is not None and not call.options.has_policies:
        replay = yield from cached(engine, call)
        if replay is not None:
            return replay
    try:
        result = yield create_command(engine, call)
    except IdempotencyError as err:
        return refused(call, err)
    if result.created:
        return Claim(result.record.fencing_token, 0, counted=False)
    return (yield from claim_existing(engine, call, result.record))


def claim_existing(
    engine: Engine,
    call: Call,
    record: StoredRecord | None,
    decided: Claim | Outcome | Pending | None = None,
) -> Generator[Command, Any, Claim | Outcome]:
    """The scope has a record (the claim answered DUPLICATE): decide (unless the caller
    did: ``decided``), and claim again while it keeps changing under us (bounded)."""
    for _ in range(_MAX_CLAIM_ROUNDS):
        if decided is None:
            decided = decide(engine, call, record)
        if isinstance(decided, Pending) or engine.cache is not None or (
            type(decided) is Outcome and decided.kind == "poisoned"
        ):
            decided = yield from settle(engine, call, record, decided)
        if decided is not None:
            return decided
        try:
            result = yield create_command(engine, call)
        except IdempotencyError as err:
            return refused(call, err)
        if result.created:
            return Claim(result.record.fencing_token, 0, counted=False)
        record, decided = result.record, None
    return refused(call, call.error(
        ErrorCode.REQUEST_IN_PROGRESS, "the scope changed hands repeatedly"
    ))


class Pending:
    """``decide``'s answer when I/O decides (``settle``): the record's lease expired, a
    policy reopens a settled scope, or a duplicate waits for the running attempt."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


EXPIRED = Pending("expired")
REOPEN = Pending("reopen")
WAIT = Pending("wait")


def decide(
    engine: Engine, call: Call, record: StoredRecord | None
) -> Claim | Outcome | Pending | None:
    """The answer for an existing record (step 3) that needs no I/O: a replay or refusal
    ``Outcome``; ``None`` when it changed meanwhile (claim again); a ``Pending`` when I/O
    decides (``settle``): ``EXPIRED`` (its owner crashed: take over or poison), ``REOPEN``
    (a policy starts a new attempt of a settled scope), ``WAIT`` (wait for the running
    attempt's outcome).  The policies are consulted only off the common paths."""
    if record is None:
        return None
    status = record.status  # a str enum: its value, with no enum property look-up
    engine.metrics.duplicate(call.scope.operation, status)
    if record.request_hash != call.request_hash:
        engine.log.warning("key_reused", status=str(status), **call.fields())
        return refused(call, call.error(
            ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST,
            "this idempotency key was used with a different payload",
        ))
    if status is SUCCESS:
        if call.options.has_policies and (answer := _settled_policy(engine, call, record)):
            return answer
        response, parent = record.response, None
        if response and response[0] == 0:  # a traced execution's envelope (NUL: never JSON)
            response, parent = unwrap(response)
        try:
            value = None if response is None else engine._loads(response)
        except SerializationError:
            return refused(call, call.error(
                ErrorCode.INTERNAL_ERROR, "stored response cannot be decoded"
            ))
        if engine.debug_enabled():  # engine.debug, inlined: a frame less on every replay
            engine.log.debug("duplicate_replayed", status="SUCCESS", **call.fields())
        outcome = replayed(call, value, record.fencing_token)
        if parent is not None:
            outcome.replayed_from = parent
        return outcome
    return _not_succeeded(engine, call, record)


def _settled_policy(engine: Engine, call: Call, record: StoredRecord) -> Outcome | Pending | None:
    """The reuse policies' answer for a SUCCESS record, if they change it."""
    if policies.reuse_due(engine, call, record):
        return REOPEN
    if call.options.on_success == "reject":
        return policies.rejected(engine, call)
    return None


def _not_succeeded(engine: Engine, call: Call, record: StoredRecord) -> Outcome | Pending:
    """``decide`` for a FAILED or PROCESSING record of the same payload."""
    if record.status is Status.UNCERTAIN:
        engine.log.warning("duplicate_uncertain", status="UNCERTAIN", **call.fields())
        detail = (record.response or b"").decode("utf-8", "replace")
        return refused(call, call.error(
            ErrorCode.OUTCOME_UNCERTAIN,
            "the outcome of a crashed attempt is uncertain until an operator resolves it"
            + (f": {detail}" if detail else ""),
        ))
    if record.status is Status.FAILED:
        if call.options.on_failure == "allow_new_attempt":
            return REOPEN
        engine.log.warning("duplicate_poisoned", status="FAILED", **call.fields())
        return refused(call, call.error(
            ErrorCode.REQUEST_FAILED, "this scope is poisoned (FAILED)"
        ), result=engine.decode_kept(call, record.response))
    if record.lease_expires_at is not None and record.lease_expires_at > engine.clock():
        if call.options.on_in_progress == "wait":
            return WAIT
        engine.log.info("duplicate_in_progress", status="PROCESSING", **call.fields())
        return refused(call, call.error(
            ErrorCode.REQUEST_IN_PROGRESS, "the first delivery is still running"
        ))
    return EXPIRED


def settle(
    engine: Engine, call: Call, record: StoredRecord | None,
    decided: Claim | Outcome | Pending | None,
) -> Generator[Command, Any, Claim | Outcome | None]:
    """The I/O a decision needs: take over or poison an expired lease, reopen a settled
    scope or wait for a running one (the policies); cache a replay."""
    if isinstance(decided, Pending):
        assert record is not None
        if decided is EXPIRED:
            return (yield from _expired_lease(engine, call, record, engine.clock()))
        if decided is REOPEN:
            return (yield from policies.reopen(engine, call, record))
        return (yield from _waited(engine, call))
    if type(decided) is Outcome and decided.kind == "poisoned":
        # a duplicate of a poisoned scope reports the counter the scope has (a rare path:
        # the one extra read is paid only here)
        with contextlib.suppress(IdempotencyError):
            decided.retry_count = yield GetRetryCount(call.scope)
    if (
        engine.cache is not None and record is not None and record.response is not None
        and record.expires_at and type(decided) is Outcome and decided.kind == "replayed"
    ):
        yield from cache_put(engine, call, record.response, record.expires_at)
    return decided


def decide_io(
    engine: Engine, call: Call, record: StoredRecord | None
) -> Generator[Command, Any, Claim | Outcome | None]:
    """``decide`` and then ``settle``: the whole decision for an existing record."""
    return (yield from settle(engine, call, record, decide(engine, call, record)))


def _expired_lease(
    engine: Engine, call: Call, record: StoredRecord, now: float
) -> Generator[Command, Any, Claim | Outcome | None]:
    """The owner crashed (no heartbeat within its lease): poison, or take over and count."""
    scope, opts, fields = call.scope, call.options, call.fields()
    if opts.on_stuck == "reconcile" and not hasattr(engine.store, "mark_uncertain"):
        return refused(call, call.error(
            ErrorCode.CONFIGURATION_ERROR,
            f"{type(engine.store).__name__} cannot mark a scope UNCERTAIN: "
            "on_stuck='reconcile' needs a store with mark_uncertain",
        ))
    try:
        if opts.on_stuck == "fail":
            poisoned = yield MarkFailed(scope, record.fencing_token, now, now + opts.ttl,
                                        only_if_lease_expired=True)
            if not poisoned:
                return (yield from _reread(engine, call))
            engine.metrics.poisoned(scope.operation)
            engine.log.warning("crashed_attempt_poisoned", status="FAILED", **fields)
            return refused(call, call.error(
                ErrorCode.REQUEST_FAILED, "a crashed attempt poisoned the scope"
            ))
        taken = yield TakeOverCall(scope, record.fencing_token, now, now + opts.lease_timeout)
        if taken is None:
            return (yield from _reread(engine, call))
        if taken.retry_count >= opts.max_retries:
            yield from write_outcome(
                engine, call, MarkFailed(scope, taken.token, now, now + opts.ttl)
            )
    except IdempotencyError as err:
        return refused(call, err)
    if taken.retry_count >= opts.max_retries:
        engine.metrics.poisoned(scope.operation)
        engine.log.warning(
            "taken_over_and_poisoned", status="FAILED", retry_count=taken.retry_count, **fields
        )
        return refused(call, call.error(
            ErrorCode.REQUEST_FAILED, "retries exhausted by crashed attempts"
        ), retry_count=taken.retry_count)
    engine.log.info("taken_over", status="PROCESSING", retry_count=taken.retry_count, **fields)
    claim = Claim(taken.token, taken.retry_count)
    if opts.on_stuck == "reconcile":
        ctx = body_context(engine, call, claim)
        return (yield from reconcile_takeover(engine, call, claim, ctx))
    return claim


def _waited(engine: Engine, call: Call) -> Generator[Command, Any, Claim | Outcome | None]:
    """``on_in_progress="wait"``: the running attempt's outcome, once it settles."""
    engine.log.info("duplicate_waiting", status="PROCESSING", **call.fields())
    try:
        settled = yield from policies.wait_for_settled(engine, call)
    except IdempotencyError as err:
        return refused(call, err)
    if settled is policies.STILL_RUNNING:
        engine.log.info("duplicate_in_progress", status="PROCESSING", waited=True, **call.fields())
        return refused(call, call.error(
            ErrorCode.REQUEST_IN_PROGRESS, "the first delivery is still running"
        ))
    assert settled is None or isinstance(settled, StoredRecord)
    return (yield from decide_io(engine, call, settled))


def _reread(engine: Engine, call: Call) -> Generator[Command, Any, Claim | Outcome | None]:
    try:
        record = yield Get(call.scope)
    except IdempotencyError as err:
        return refused(call, err)
    if record is None or engine.expired(record, engine.clock()):
        return None
    return (yield from decide_io(engine, call, record))


def unkeyed(
    engine: Engine, operation: str, fn: Callable[[], Any], permanent: Permanent
) -> Flow:
    """``require_key=False`` and no key: the body runs without deduplication (counted as
    ``unkeyed``); nothing is recorded, whatever it does."""
    engine.unkeyed(operation)
    try:
        value = yield RunBody(fn, (), None, None)
    except Exception as exc:
        kind: OutcomeKind = "poisoned" if is_permanent(exc, permanent) else "failed"
        return Outcome(
            kind, error=type(exc).__name__, detail=f"{type(exc).__name__}: {exc}"[:500],
            exception=exc, operation=operation, ran=True,
        )
    return Outcome("executed", result=value, operation=operation, ran=True)


# ---------------------------------------------------------------------- the body
def body_context(engine: Engine, call: Call, claim: Claim) -> IdempotencyContext:
    """What ``current_context()`` returns inside the body: a fresh claim's counter is read
    only if someone asks for it (it costs a round trip; on an event loop it is awaited, see
    :class:`~.records.LazyCountContext`)."""
    scope = call.scope
    return BodyContext(
        scope.tenant, scope.operation, scope.key, call.request_hash, "executing",
        claim.retry_count, claim.token, reader=None if claim.counted else engine, scope=scope,
        engine=engine,
    )


def lease_of(engine: Engine, call: Call, claim: Claim) -> Lease | None:
    if engine.heartbeat is None:
        return None
    return Lease(call.scope, claim.token, call.options.lease_timeout)


__all__ = [
    "Flow",
    "body_context",
    "claim_existing",
    "claim_scope",
    "create_command",
    "decide",
    "decide_io",
    "execute",
    "lease_of",
    "run_owned",
    "unkeyed",
]
