"""The past attempts of a scope: the audit trail of the reuse policies.

``on_failure="allow_new_attempt"`` and ``reuse_after`` give a settled scope to a new attempt
(:func:`.policies.reopen`); the settled attempt's record is overwritten by the new one.  What
it was — its fencing token, its status, when it settled and what it kept — stays readable as
an :class:`Attempt` through ``handler.get_attempts`` (the CLI's ``inspect``, the dashboard
and the Django admin show it), for the last :data:`KEPT_ATTEMPTS` attempts of the scope.

Where it lives: in the scope's steps blob (``stores.effects``), under a part no step can be
named (step names starting with NUL are refused).  So the history costs no store primitive
and nothing on the hot path: only the reopen path (rare) reads the blob before it reopens
and writes the history back, fenced by the new attempt's token, after.  It follows the
steps' lifetime, which is the retry counter's:

* a step recorded later re-saves the whole blob, history included (the journal keeps every
  part it loaded); a release, a takeover and a counted failure keep it;
* ``unpoison``, the expiry of the scope's record and the counter cleanup remove it with the
  counter — an operator who resets a scope starts its trail afresh;
* a store without recorded steps keeps no history (``get_attempts`` answers ``[]``).

Writing the history is best effort: when the write fails (the store went down, or the new
attempt's lease was already taken over) the new attempt runs anyway and
``attempt_history_not_recorded`` is logged — the audit trail must not block the work.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .commands import Command
from .engine import Call, Engine
from .errors import IdempotencyError
from .records import Scope, Status, StoredRecord
from .steps import HISTORY_PART, decode_steps, encode_steps, supports_steps
from .store_calls import LoadSteps, SaveSteps
from .tracing import unwrap

#: How many past attempts a scope keeps (the oldest goes first).
KEPT_ATTEMPTS = 10
#: The longest ``detail`` kept, in characters (the rest is cut, marked with "…").
DETAIL_CHARS = 500


@dataclass(frozen=True, slots=True)
class Attempt:
    """A settled attempt of a scope that a reuse policy gave to a new attempt.

    ``status`` is FAILED (``on_failure="allow_new_attempt"``) or SUCCESS (``reuse_after``);
    ``settled_at`` the record's ``updated_at`` when it was replaced (epoch seconds from the
    handler's clock); ``detail`` what a FAILED record kept — the value a body's
    ``Poison(result=...)`` kept, or an operator's resolution detail — as text, at most
    :data:`DETAIL_CHARS` characters; ``None`` when it kept nothing, and for a SUCCESS."""

    fencing_token: int
    status: Status
    settled_at: float
    detail: str | None = None


def _kept(blob: bytes | None) -> list[dict[str, Any]]:
    """The history part of a steps blob as stored, oldest first (``[]`` when none)."""
    raw = decode_steps(blob).get(HISTORY_PART)
    kept: list[dict[str, Any]] = json.loads(raw) if raw is not None else []
    return kept


def attempts_in(blob: bytes | None) -> list[Attempt]:
    """The attempts kept in a steps blob, oldest first (``[]`` when it keeps none)."""
    return [
        Attempt(int(item["token"]), Status(item["status"]), float(item["settled_at"]),
                item.get("detail"))
        for item in _kept(blob)
    ]


def _entry(record: StoredRecord) -> dict[str, Any]:
    detail = None
    if record.status is Status.FAILED and record.response is not None:
        detail = unwrap(record.response)[0].decode("utf-8", "replace")
        if len(detail) > DETAIL_CHARS:
            detail = detail[: DETAIL_CHARS - 1] + "…"
    return {"token": record.fencing_token, "status": str(record.status),
            "settled_at": record.updated_at, "detail": detail}


def history_after(blob: bytes | None, settled: StoredRecord) -> bytes:
    """The steps blob a new attempt starts with: no step, the history of ``blob`` with
    ``settled`` appended, the last :data:`KEPT_ATTEMPTS` of it."""
    kept = [*_kept(blob), _entry(settled)][-KEPT_ATTEMPTS:]
    encoded = json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return encode_steps({HISTORY_PART: encoded})


def before_reopen(engine: Engine, call: Call) -> Generator[Command, Any, bytes | None]:
    """The settled scope's steps blob, read before ``reopen`` resets it (``None`` when the
    store records no steps).  Store errors propagate: nothing has changed yet."""
    if not supports_steps(engine):
        return None
    blob: bytes | None = yield LoadSteps(call.scope)
    return blob


def remember(
    engine: Engine, call: Call, token: int, blob: bytes | None, settled: StoredRecord
) -> Generator[Command, Any, None]:
    """Write the history with ``settled`` in it for the new attempt ``token`` (fenced);
    logged, never raised, when it cannot be written (see the module docstring)."""
    if not supports_steps(engine):
        return
    reason = "superseded"
    try:
        saved = yield SaveSteps(call.scope, token, history_after(blob, settled), engine.clock())
    except IdempotencyError as err:
        saved, reason = False, err.code.value
    if not saved:
        engine.log.warning("attempt_history_not_recorded", reason=reason,
                           previous_token=settled.fencing_token, token=token, **call.fields())


def read_attempts(engine: Engine, scope: Scope) -> Generator[Command, Any, list[Attempt]]:
    """``handler.get_attempts``: the scope's past attempts, oldest first."""
    if not supports_steps(engine):
        return []
    blob: bytes | None = yield LoadSteps(scope)
    return attempts_in(blob)


__all__ = [
    "DETAIL_CHARS",
    "KEPT_ATTEMPTS",
    "Attempt",
    "attempts_in",
    "before_reopen",
    "history_after",
    "read_attempts",
    "remember",
]
