"""A scope's past attempts (``handler.get_attempts``): what ``on_failure="allow_new_attempt"``
and ``reuse_after`` keep of the settled attempt they replace, against every store (sync, and
async through the async face)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent_tasks import (
    Attempt,
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    MemoryStore,
    Poison,
    Status,
    current_context,
)
from idempotent_tasks._core.attempts import DETAIL_CHARS, KEPT_ATTEMPTS
from idempotent_tasks.testing import FakeClock, FaultyStore

from . import _every_store
from ._every_store import SCOPE, Body, Events, make_handler

#: Every test that takes ``store`` runs on every store kind, sync and async.
store = _every_store.store


def test_a_new_attempt_keeps_the_poisoned_one_in_the_history(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, max_retries=1)
    poisoned = h.run(Body(ConnectionError("down")), **SCOPE)
    assert poisoned.kind == "poisoned" and h.get_attempts(**SCOPE) == []
    settled_at = h.get_record(**SCOPE).updated_at
    clock.advance(7)
    again = h.run(Body("fixed"), on_failure="allow_new_attempt", **SCOPE)
    assert (again.kind, again.result) == ("executed", "fixed")
    assert h.get_attempts(**SCOPE) == [
        Attempt(poisoned.fencing_token, Status.FAILED, settled_at, None)
    ]
    assert h.get_record(**SCOPE).fencing_token == again.fencing_token


def test_the_history_keeps_what_the_poisoned_record_kept(store: Any) -> None:
    h = make_handler(store, FakeClock(), on_failure="allow_new_attempt")
    h.run(Body(Poison(result={"reason": "card declined"})), **SCOPE)
    h.run(Body(Poison(result="x" * (DETAIL_CHARS * 2))), **SCOPE)
    h.run(Body(), **SCOPE)
    first, second = h.get_attempts(**SCOPE)
    assert first.detail == '{"reason":"card declined"}'
    assert second.detail == '"' + "x" * (DETAIL_CHARS - 2) + "…"
    assert len(second.detail) == DETAIL_CHARS


def test_eleven_new_attempts_keep_the_last_ten(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, on_failure="allow_new_attempt")
    tokens = []
    for _ in range(KEPT_ATTEMPTS + 2):
        tokens.append(h.run(Body(Poison()), **SCOPE).fencing_token)
        clock.advance(1)
    history = h.get_attempts(**SCOPE)
    assert [a.fencing_token for a in history] == tokens[1:-1]  # the oldest went; the last runs
    assert {a.status for a in history} == {Status.FAILED}
    assert [a.settled_at for a in history] == sorted(a.settled_at for a in history)


def test_steps_of_the_new_attempt_keep_the_history(store: Any) -> None:
    h = make_handler(store, FakeClock(), max_retries=3, on_failure="allow_new_attempt")
    poisoned = h.run(Body(Poison()), **SCOPE)
    effects: list[str] = []

    def body(fail: bool) -> Any:
        def charge() -> str:
            effects.append("charged")
            return "ch_1"

        charged = current_context().step("charge", charge)
        if fail:
            raise ConnectionError("ledger down")  # transient: released, steps kept
        return charged

    assert h.run(lambda: body(True), **SCOPE).kind == "failed"
    outcome = h.run(lambda: body(False), **SCOPE)
    assert (outcome.kind, outcome.result, effects) == ("executed", "ch_1", ["charged"])
    assert [a.fencing_token for a in h.get_attempts(**SCOPE)] == [poisoned.fencing_token]


def test_a_new_attempt_starts_without_the_old_attempts_steps(store: Any) -> None:
    h = make_handler(store, FakeClock(), on_failure="allow_new_attempt")
    calls: list[int] = []

    def body(then: BaseException | None) -> Any:
        current_context().step("send", lambda: calls.append(1))
        if then is not None:
            raise then
        return "sent"

    h.run(lambda: body(Poison()), **SCOPE)
    assert h.run(lambda: body(None), **SCOPE).kind == "executed"
    assert len(calls) == 2  # reopen resets the steps; the history is all that carries over
    assert len(h.get_attempts(**SCOPE)) == 1


def test_reuse_after_keeps_the_replaced_success(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, reuse_after=60)
    first = h.run(Body("v1"), **SCOPE)
    clock.advance(60)
    assert h.run(Body("v2"), **SCOPE).kind == "executed"
    assert h.get_attempts(**SCOPE) == [
        Attempt(first.fencing_token, Status.SUCCESS, clock() - 60, None)
    ]


def test_unpoison_starts_the_trail_afresh(store: Any) -> None:
    h = make_handler(store, FakeClock())
    h.run(Body(Poison()), **SCOPE)
    h.run(Body(Poison()), on_failure="allow_new_attempt", **SCOPE)
    assert len(h.get_attempts(**SCOPE)) == 1
    h.unpoison(**SCOPE)
    assert h.get_attempts(**SCOPE) == []


# ------------------------------------------------------------------ the reserved part, faults
def test_a_step_cannot_take_the_historys_name() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    refused: list[ConfigurationError] = []

    def body() -> None:
        with pytest.raises(ConfigurationError, match="reserved") as caught:
            current_context().step("\x00attempts", lambda: 1)
        refused.append(caught.value)

    assert h.run(body, **SCOPE).kind == "executed" and len(refused) == 1


def test_a_history_that_cannot_be_written_does_not_block_the_new_attempt() -> None:
    store, events = FaultyStore(MemoryStore()), Events()
    h = make_handler(store, FakeClock(), events, on_failure="allow_new_attempt")
    h.run(Body(Poison()), **SCOPE)
    store.fail("save_steps")
    assert h.run(Body("fixed"), **SCOPE).kind == "executed"
    assert "attempt_history_not_recorded" in events.seen
    assert h.get_attempts(**SCOPE) == []


def test_a_history_that_cannot_be_read_refuses_before_anything_changed() -> None:
    store = FaultyStore(MemoryStore())
    h = make_handler(store, FakeClock(), on_failure="allow_new_attempt")
    poisoned = h.run(Body(Poison()), **SCOPE)
    store.fail("load_steps")
    body = Body()
    outcome = h.run(body, **SCOPE)
    assert (outcome.kind, outcome.error_code, body.calls) == (
        "store_unavailable", ErrorCode.STORE_UNAVAILABLE, 0
    )
    record = h.get_record(**SCOPE)
    assert (record.status, record.fencing_token) == (Status.FAILED, poisoned.fencing_token)
