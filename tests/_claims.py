"""Claim a scope the way a worker that then dies would (tests only)."""

from __future__ import annotations

from typing import Any

from idempotent_tasks import IdempotencyHandler, Outcome
from idempotent_tasks._core.drivers import drive
from idempotent_tasks._core.engine import Call, Claim
from idempotent_tasks._core.flow import body_context, claim_scope
from idempotent_tasks._core.recording import complete


def claimed(handler: IdempotencyHandler, call: Call | None) -> Claim:
    """Run only the claim of ``call``: the record stays PROCESSING (the "worker" died)."""
    assert call is not None
    engine = handler._engine
    got: Any = drive(engine, claim_scope(engine, call))
    assert not isinstance(got, Outcome), f"the scope was not claimed: {got}"
    return got  # type: ignore[no-any-return]


def completed(handler: IdempotencyHandler, call: Call | None, claim: Claim, value: Any) -> bool:
    """The claiming worker finishes after all: its SUCCESS write (True when recorded)."""
    assert call is not None
    engine = handler._engine
    ctx = body_context(engine, call, claim)
    outcome = drive(engine, complete(engine, call, claim, ctx, value))
    return outcome.kind == "executed"
