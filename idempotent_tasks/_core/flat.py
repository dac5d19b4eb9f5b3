"""The two common deliveries as straight-line code: a first delivery that claims a free
scope and runs to a written SUCCESS, and a duplicate whose record answers at once (a replay,
a refusal).  Done for speed: on the synchronous path every delivery takes this route, and
driving the generator flow (:mod:`.flow`) costs about a tenth of a delivery's CPU — a
frame resumption and a command dispatch per step, the driver's loop, the flow's set-up.

Nothing is decided here.  The claim, the store calls and the body are the flow's own
(``create_command``, the instrumented store wrapper, ``run_body``), the duplicate's answer
is ``flow.decide``, and the SUCCESS write is ``recording.success_write``.  Everything else —
a duplicate that needs I/O to settle (an expired lease, a policy, a wait), a body that
raised, a result that cannot be stored, a write the store refused or could not take, the
change-feed announcement — is handed to the flow's generators at the point reached and
driven to its end, so the rare paths exist once.  Used for a sync store without a cache
while no tracer is installed (``calls.run_call``); the async path, transactional bodies
and batches always run the flow.  The store contract suite and the engine's tests run on
this path; ``tests/test_flat_path.py`` holds each hand-over to the flow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..typing import Permanent
from . import policies
from .answers import refused
from .commands import run_body
from .drivers import drive
from .engine import Call, Claim, Engine
from .errors import IdempotencyError
from .flow import (
    Flow,
    Pending,
    body_context,
    claim_existing,
    create_command,
    decide,
    lease_of,
)
from .flow import execute as flow_execute
from .outcome import Outcome
from .recording import (
    body_failed,
    recorded,
    succeeded,
    success_not_written,
    success_write,
    unstorable,
)
from .records import CREATED, IdempotencyContext, StoredRecord


def run_flat(engine: Engine, call: Call, fn: Callable[[], Any], permanent: Permanent) -> Outcome:
    """``flow.execute(engine, call, fn, permanent)`` driven on this thread, the common
    cases without the generator (see the module docstring)."""
    try:
        result = engine.io.call(create_command(engine, call))
    except IdempotencyError as err:
        return refused(call, err)
    if result.outcome is not CREATED:
        decided = decide(engine, call, result.record)
        if type(decided) is Outcome and decided.kind != "poisoned":
            return decided  # a replay or a refusal: no more I/O
        return drive(engine, _settle_then_run(engine, call, fn, permanent, result.record, decided))
    claim = Claim(result.record.fencing_token, 0, counted=False)
    ctx = body_context(engine, call, claim)
    try:
        value = run_body(engine, fn, (), ctx, lease_of(engine, call, claim))
    except BaseException as exc:
        outcome = drive(engine, body_failed(engine, call, claim, ctx, exc, permanent))
    else:
        outcome = _complete(engine, call, claim, ctx, value)
    if call.options.on_in_progress == "wait":  # duplicates may wait for this outcome
        drive(engine, policies.announce(engine, call))
    return outcome


def _complete(
    engine: Engine, call: Call, claim: Claim, ctx: IdempotencyContext, value: Any
) -> Outcome:
    """``recording.complete`` for a written SUCCESS; any other turn continues in it."""
    try:
        encoded = engine.encode_response(call, value)
    except IdempotencyError as err:  # the body ran: it must never run again
        return drive(engine, unstorable(engine, call, claim, ctx, err))
    command = success_write(engine, call, claim, encoded)
    try:
        stored = engine.io.call(command)
    except IdempotencyError as exc:
        return drive(engine, success_not_written(engine, call, claim, ctx, command, exc))
    if stored:  # no cache on this path: nothing more to write
        return recorded(engine, call, claim, ctx, encoded)
    # refused (fenced off, or released while we were paused): adopt the scope or stand down
    return drive(engine, succeeded(engine, call, claim, ctx, command.response, False,
                                   command.now))


def _settle_then_run(
    engine: Engine, call: Call, fn: Callable[[], Any], permanent: Permanent,
    record: StoredRecord | None, decided: Claim | Outcome | Pending | None,
) -> Flow:
    """A duplicate whose answer needs I/O (``flow.claim_existing``), then, if the scope
    became ours, the body and its outcome (``flow.execute`` from the claim on)."""
    claimed = yield from claim_existing(engine, call, record, decided)
    if not isinstance(claimed, Claim):
        return claimed
    return (yield from flow_execute(engine, call, fn, permanent, claimed))
