"""The sequential specification the histories are checked against: ``tests/test_model.py``'s
:class:`~tests.test_model.Model` (the store contract stated plainly), for one scope, plus
the fencing-token rule the model leaves to its caller.

A state is a :class:`ScopeState`: the scope's record, its retry counter and the greatest
fencing token issued so far.  :func:`successors` answers, for a state and an operation,
every state the operation can lead to *while producing what the history says it
produced* — none when the observed result is impossible in that state:

* a known operation has at most one successor.  A claim (``create`` CREATED, a
  ``take_over`` that succeeded) must carry a token greater than every token issued before
  it in the order being tried; the model is then given that token (tokens are chosen by the
  store, so the history supplies them);
* an indeterminate operation (result unknown) accepts any result: its successor is what the
  model does with its arguments.  An indeterminate claim that would create an attempt
  branches: its token is one of the ``candidates`` (tokens seen in the history that no known
  claim issued) or, if nobody ever saw it, a placeholder no one can hold (a negative number
  of its own), which does not advance the greatest token — nobody learnt the real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from idempotent_tasks._core.records import Scope
from tests.test_model import NEVER_ISSUED, MCounter, Model, MRecord

from .history import Op, as_mrecord

#: The one scope a per-scope model works on (histories are split by scope first).
SCOPE = Scope("lin", "op", "k")


class ScopeState(NamedTuple):
    record: MRecord | None
    counter: tuple[int, float] | None
    last_token: int | None


INITIAL = ScopeState(None, None, None)


def _model(state: ScopeState) -> Model:
    m = Model()
    if state.record is not None:
        m.records[SCOPE] = state.record
    if state.counter is not None:
        m.counters[SCOPE] = MCounter(*state.counter)
    return m


def _state(m: Model, last_token: int | None) -> ScopeState:
    counter = m.counters.get(SCOPE)
    return ScopeState(m.records.get(SCOPE),
                      None if counter is None else (counter.count, counter.updated_at),
                      last_token)


def _fresh(state: ScopeState, token: int) -> bool:
    return state.last_token is None or token > state.last_token


def successors(
    state: ScopeState, op: Op, candidates: Sequence[int] = (), placeholder: int = -1
) -> list[ScopeState]:
    """The states ``op`` can lead to from ``state`` producing its recorded result."""
    if op.name == "create":
        return _create(state, op, candidates, placeholder)
    if op.name == "take_over":
        return _take_over(state, op, candidates, placeholder)
    if op.name == "get":
        return [state] if as_mrecord(op.result) == state.record else []
    if op.name == "get_retry_count":
        count = state.counter[0] if state.counter is not None else 0
        return [state] if op.result == count else []
    m = _model(state)
    got = _write(m, op)
    if op.known and _observed(op) != got:
        return []
    return [_state(m, state.last_token)]


def _write(m: Model, op: Op) -> Any:
    """A conditional write on the model, as the store contract states it."""
    a = op.args
    if op.name == "heartbeat":
        return m.heartbeat(SCOPE, a["tok"], a["now"], a["lease"])
    if op.name == "mark_success":
        return m.mark_success(SCOPE, a["tok"], a["resp"].encode("latin-1"), a["now"], a["exp"])
    if op.name == "mark_failed":
        return m.mark_failed(SCOPE, a["tok"], a["now"], a["exp"], a["only"])
    if op.name == "release":
        return m.release(SCOPE, a["tok"])
    if op.name == "record_failure":
        got = m.record_failure(SCOPE, a["tok"], a["now"], a["max"], a["exp"], a["only"])
        return None if got is None else [got.retry_count, got.poisoned]
    raise ValueError(f"not an operation of the store contract: {op.name}")


def _observed(op: Op) -> Any:
    return op.result if op.name == "record_failure" else bool(op.result)


def _create(
    state: ScopeState, op: Op, candidates: Sequence[int], placeholder: int
) -> list[ScopeState]:
    a = op.args
    if not op.known:
        probe = _model(state)
        would_create, _, _ = probe.create(SCOPE, a["h"], NEVER_ISSUED, a["now"], a["lease"])
        if not would_create:
            return [state]
        return [_claimed_by_create(state, op, token) for token in _tokens(state, candidates)] + [
            _claimed_by_create(state, op, placeholder, advance=False)
        ]
    created, observed = op.result["created"], as_mrecord(op.result["record"])
    assert observed is not None
    if created and not _fresh(state, observed.token):
        return []
    m = _model(state)
    token = observed.token if created else NEVER_ISSUED
    did, expected, _ = m.create(SCOPE, a["h"], token, a["now"], a["lease"])
    if did != created or expected != observed:
        return []
    return [_state(m, observed.token)] if created else [state]


def _claimed_by_create(
    state: ScopeState, op: Op, token: int, *, advance: bool = True
) -> ScopeState:
    m = _model(state)
    m.create(SCOPE, op.args["h"], token, op.args["now"], op.args["lease"])
    return _state(m, token if advance else state.last_token)


def _take_over(
    state: ScopeState, op: Op, candidates: Sequence[int], placeholder: int
) -> list[ScopeState]:
    a = op.args
    if not op.known or op.result is None:
        probe = _model(state)
        refused = probe.take_over(SCOPE, a["tok"], NEVER_ISSUED, a["now"], a["lease"]) is None
        if refused:
            return [state]
        if op.known:  # the store refused what the model grants
            return []
        return [_taken_over(state, op, t) for t in _tokens(state, candidates)] + [
            _taken_over(state, op, placeholder, advance=False)
        ]
    count, token = op.result
    if not _fresh(state, token):
        return []
    m = _model(state)
    if m.take_over(SCOPE, a["tok"], token, a["now"], a["lease"]) != count:
        return []
    return [_state(m, token)]


def _taken_over(state: ScopeState, op: Op, token: int, *, advance: bool = True) -> ScopeState:
    m = _model(state)
    m.take_over(SCOPE, op.args["tok"], token, op.args["now"], op.args["lease"])
    return _state(m, token if advance else state.last_token)


def _tokens(state: ScopeState, candidates: Sequence[int]) -> list[int]:
    return [t for t in candidates if _fresh(state, t)]
