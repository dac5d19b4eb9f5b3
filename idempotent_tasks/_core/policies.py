"""The per-operation policies on a settled scope: what a duplicate of a SUCCESS gets, and
when a settled scope starts a new attempt.

==========================================  ==============================================
policy (per operation)                      a delivery that finds the scope …
==========================================  ==============================================
``on_success="replay"`` (default)           SUCCESS → the stored result (``replayed``)
``on_success="reject"``                     SUCCESS → ``rejected``, ``DUPLICATE_REJECTED``
``reuse_after=S``                           SUCCESS settled ``S`` seconds ago or more → a
                                            new attempt (new fencing token, counter reset)
``on_failure="reject"`` (default)           FAILED → ``poisoned``, ``REQUEST_FAILED``
``on_failure="allow_new_attempt"``          FAILED → a new attempt (new token, counter
                                            reset; the poisoned attempt is logged and kept
                                            in the scope's past attempts)
==========================================  ==============================================

A new attempt is the store's ``reopen`` (:mod:`idempotent_tasks.stores.reopen`): one atomic
write conditional on the settled record's fencing token, so of concurrent deliveries exactly
one starts it and the others see it running.  The settled attempt it replaces joins the
scope's past attempts (:mod:`.attempts`: one read before the reopen, one fenced write after,
on this path only).  ``on_in_progress="wait"``: ``wait_for_settled``
(the waiting itself, bounded, in :mod:`.waiting`).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from . import attempts
from .answers import refused
from .commands import Command
from .engine import Call, Claim, Engine
from .errors import ErrorCode, IdempotencyError
from .outcome import Outcome
from .records import Status, StoredRecord
from .store_calls import Get, Reopen
from .waiting import Announce, Nap

#: The policy options, spelled as ``run``'s keywords and every integration's options
#: (``reconcile``: the function ``on_stuck="reconcile"`` asks, :mod:`.reconcile`).
POLICY_NAMES = (
    "on_in_progress", "wait_timeout", "on_success", "reuse_after", "on_failure", "reconcile",
)

_FIRST_LOOK = 0.005
_LONGEST_NAP = 0.25


def given_policies(source: object) -> dict[str, Any]:
    """The policies an integration's settings object sets (its :data:`POLICY_NAMES`
    attributes that are not ``None``), as keywords for ``run`` / ``register_operation``."""
    values = {name: getattr(source, name, None) for name in POLICY_NAMES}
    return {name: value for name, value in values.items() if value is not None}


def reuse_due(engine: Engine, call: Call, record: StoredRecord) -> bool:
    """``reuse_after``: the SUCCESS settled long enough ago that a new attempt may run."""
    after = call.options.reuse_after
    return after is not None and record.updated_at + after <= engine.clock()


def rejected(engine: Engine, call: Call) -> Outcome:
    """``on_success="reject"``: a duplicate of a SUCCESS is refused, not answered."""
    engine.log.info("duplicate_rejected", status="SUCCESS", **call.fields())
    return refused(call, call.error(
        ErrorCode.DUPLICATE_REJECTED,
        "this operation refuses a second call of a scope that succeeded",
    ))


def reopen(
    engine: Engine, call: Call, record: StoredRecord
) -> Generator[Command, Any, Claim | Outcome | None]:
    """Give the settled scope to this delivery as a new attempt: a :class:`Claim`; ``None``
    when another delivery changed it first (claim again); a refusal when the store cannot."""
    if not hasattr(engine.store, "reopen"):
        return refused(call, call.error(
            ErrorCode.CONFIGURATION_ERROR,
            f"{type(engine.store).__name__} cannot start a new attempt of a settled scope "
            "(reuse_after and on_failure='allow_new_attempt' need a store with reopen)",
        ))
    try:
        past = yield from attempts.before_reopen(engine, call)
        now = engine.clock()
        token = yield Reopen(
            call.scope, record.fencing_token, now, now + call.options.lease_timeout
        )
    except IdempotencyError as err:
        return refused(call, err)
    if token is None:
        return None
    yield from attempts.remember(engine, call, token, past, record)
    failed = record.status is Status.FAILED
    log = engine.log.warning if failed else engine.log.info
    log(
        "new_attempt_after_failure" if failed else "new_attempt_after_reuse",
        status="PROCESSING", previous_status=str(record.status),
        previous_token=record.fencing_token, token=token, **call.fields(),
    )
    return Claim(token, 0)


#: What ``wait_for_settled`` returns when the running attempt did not settle in time, its
#: lease expired, or no waiter slot was free: the duplicate answers ``in_progress``.
STILL_RUNNING = object()


def wait_for_settled(
    engine: Engine, call: Call
) -> Generator[Command, Any, StoredRecord | object | None]:
    """Look at the scope's record, with backoff, until it is settled (SUCCESS or FAILED:
    returned), gone (``None``: released after a transient failure — claim it again) or
    ``STILL_RUNNING``.  Store errors propagate (the caller refuses with them)."""
    if not engine.waiters.enter():
        return STILL_RUNNING
    try:
        deadline = time.monotonic() + call.options.wait_timeout
        nap = _FIRST_LOOK
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return STILL_RUNNING
            yield Nap(call.scope, nap, left)
            nap = min(nap * 2, _LONGEST_NAP)
            record: StoredRecord | None = yield Get(call.scope)
            if record is None or record.status is not Status.PROCESSING:
                return record
            lease = record.lease_expires_at
            if lease is not None and lease <= engine.clock():
                return STILL_RUNNING  # its owner crashed: the takeover is a later delivery's
    finally:
        engine.waiters.leave()


def announce(engine: Engine, call: Call) -> Generator[Command, Any, None]:
    """``on_in_progress="wait"``: the attempt's outcome is written; wake the scope's waiters
    in every process (on a store with a change feed; a failure is logged, not raised)."""
    failed = yield Announce(call.scope)
    if failed is not None:
        engine.log.warning("change_announce_failed", error=type(failed).__name__,
                           **call.fields())


__all__ = [
    "POLICY_NAMES", "STILL_RUNNING", "announce", "given_policies", "rejected", "reopen",
    "reuse_due", "wait_for_settled",
]
