"""Effects outside the database — recorded steps, derived keys, reconciliation before a
re-run and the UNCERTAIN status operators resolve — against every store (sync, and async
through ``run_async``).  A crash is a body held open by events whose lease the test's clock
lets expire: exactly what a killed worker leaves behind, as far as the store can tell."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryStore,
    Reconciled,
    Status,
    current_context,
)
from idempotent_tasks.testing import FakeClock

from . import _every_store
from ._every_store import SCOPE, Body, make_handler
from ._wait import budget

#: Every test that takes ``store`` runs on every store kind, sync and async.
store = _every_store.store


class Effects:
    """External effects, counted by name (what a card processor or a mailer would see)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, name: str, result: Any = None) -> Any:
        with self._lock:
            self.seen.append(name)
        return {"done": name} if result is None else result


class ThreeSteps:
    """A body of three steps; ``hold_after`` holds it open after that step (a worker about
    to die there), ``fail_after`` raises a transient error there."""

    def __init__(self, effects: Effects, hold_after: str | None = None,
                 fail_after: str | None = None) -> None:
        self.effects = effects
        self.hold_after, self.fail_after = hold_after, fail_after
        self.held, self.go = threading.Event(), threading.Event()

    def __call__(self) -> Any:
        ctx = current_context()
        results = []
        for name in ("charge", "email", "ledger"):
            results.append(ctx.step(name, self.effects, name))
            if name == self.fail_after:
                raise ConnectionError("transient")
            if name == self.hold_after:
                self.held.set()
                assert self.go.wait(budget(10))
        return results


def crash_after(h: Any, clock: FakeClock, body: ThreeSteps, lease: float = 30) -> threading.Thread:
    """Run ``body`` until it is held, then let its lease expire: a crashed owner."""
    thread = threading.Thread(target=lambda: h.run(body, **SCOPE))
    thread.start()
    assert body.held.wait(budget(10))
    clock.advance(lease + 1)
    return thread


def finish(thread: threading.Thread, body: ThreeSteps) -> None:
    body.go.set()
    thread.join(budget(10))


# ------------------------------------------------------------------ steps
def test_a_retry_replays_the_recorded_steps_and_runs_the_rest(store: Any) -> None:
    effects = Effects()
    h = make_handler(store, FakeClock())
    failed = h.run(ThreeSteps(effects, fail_after="email"), **SCOPE)
    assert (failed.kind, failed.retry_count) == ("failed", 1)
    done = h.run(ThreeSteps(effects), **SCOPE)
    assert done.kind == "executed"
    assert effects.seen == ["charge", "email", "ledger"]  # each effect exactly once
    assert done.result == [{"done": "charge"}, {"done": "email"}, {"done": "ledger"}]


def test_a_takeover_runs_only_the_steps_the_crashed_attempt_had_not_recorded(
    store: Any,
) -> None:
    effects, clock = Effects(), FakeClock()
    h = make_handler(store, clock)
    crashed = ThreeSteps(effects, hold_after="email")
    thread = crash_after(h, clock, crashed)
    taken = h.run(ThreeSteps(effects), **SCOPE)
    assert (taken.kind, taken.retry_count) == ("executed", 1)
    assert effects.seen == ["charge", "email", "ledger"]
    finish(thread, crashed)


def test_a_stale_owner_cannot_record_a_step_after_a_takeover(store: Any) -> None:
    effects, clock = Effects(), FakeClock()
    h = make_handler(store, clock)
    stale = ThreeSteps(effects, hold_after="charge")
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(h.run(stale, **SCOPE)))
    thread.start()
    assert stale.held.wait(budget(10))
    clock.advance(31)
    newer = ThreeSteps(effects, hold_after="charge")
    other = threading.Thread(target=lambda: outcomes.append(h.run(newer, **SCOPE)))
    other.start()
    assert newer.held.wait(budget(10))  # the takeover replayed "charge" and holds the scope
    stale.go.set()
    thread.join(budget(10))
    assert outcomes[0].kind == "superseded"  # its "email" step was refused, nothing recorded
    newer.go.set()
    other.join(budget(10))
    assert outcomes[1].kind == "executed"
    assert effects.seen == ["charge", "email", "email", "ledger"]  # the stale one's email ran
    assert h.get_record(**SCOPE).status is Status.SUCCESS


def test_steps_go_with_the_counter_when_the_scope_is_unpoisoned(store: Any) -> None:
    effects = Effects()
    h = make_handler(store, FakeClock(), max_retries=1)
    assert h.run(ThreeSteps(effects, fail_after="charge"), **SCOPE).kind == "poisoned"
    h.unpoison(**SCOPE)
    assert h.run(ThreeSteps(effects), **SCOPE).kind == "executed"
    assert effects.seen == ["charge", "charge", "email", "ledger"]


def test_a_step_name_is_unique_per_body(store: Any) -> None:
    h = make_handler(store, FakeClock())

    def body() -> Any:
        ctx = current_context()
        ctx.step("charge", lambda: 1)
        return ctx.step("charge", lambda: 2)

    outcome = h.run(body, **SCOPE)
    assert outcome.kind == "poisoned"  # a programming error: a configuration error poisons
    assert isinstance(outcome.exception, ConfigurationError)


def test_a_step_result_that_cannot_be_stored_poisons_the_scope(store: Any) -> None:
    h = make_handler(store, FakeClock())
    charged: list[int] = []

    def body() -> Any:
        return current_context().step("charge", lambda: charged.append(1) or object())

    assert h.run(body, **SCOPE).kind == "poisoned"
    assert h.run(body, **SCOPE).kind == "poisoned"
    assert charged == [1]  # never run again automatically


def test_steps_in_a_coroutine_body() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    effects = Effects()

    async def body(fail: bool) -> Any:
        ctx = current_context()

        async def effect(name: str) -> Any:
            return effects(name)

        first = await ctx.step_async("charge", effect, "charge")
        if fail:
            raise ConnectionError("transient")
        return [first, await ctx.step_async("email", effect, "email")]

    assert asyncio.run(h.run_async(lambda: body(True), **SCOPE)).kind == "failed"
    done = asyncio.run(h.run_async(lambda: body(False), **SCOPE))
    assert (done.kind, effects.seen) == ("executed", ["charge", "email"])


def test_a_blocking_step_on_the_event_loop_is_refused() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)

    async def body() -> Any:
        return current_context().step("charge", lambda: 1)

    outcome = asyncio.run(h.run_async(body, **SCOPE))
    assert isinstance(outcome.exception, ConfigurationError)


def test_derived_keys_are_stable_per_scope_and_name() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    seen: list[tuple[str, str]] = []

    def body() -> Any:
        ctx = current_context()
        seen.append((ctx.derived_key("stripe"), ctx.derived_key("mailer")))
        raise ConnectionError("again")

    h.run(body, **SCOPE)
    h.run(body, **SCOPE)
    h.run(body, **{**SCOPE, "tenant": "other"})
    assert seen[0] == seen[1] and seen[0][0] != seen[0][1]
    assert seen[2][0] != seen[0][0]
    assert len(seen[0][0]) <= 255


# ------------------------------------------------------------------ reconciliation
def reconciling(answer: Any, asked: list[Any]) -> Any:
    def reconcile(ctx: Any) -> Reconciled:
        asked.append((ctx.key, ctx.fencing_token, ctx.derived_key("charge")))
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    return reconcile


def test_reconciled_done_records_the_result_and_replays_it(store: Any) -> None:
    effects, clock, asked = Effects(), FakeClock(), []
    h = make_handler(store, clock, on_stuck="reconcile",
                     reconcile=reconciling(Reconciled.done({"charged": 100}), asked))
    crashed = ThreeSteps(effects, hold_after="charge")
    thread = crash_after(h, clock, crashed)
    body = Body()
    outcome = h.run(body, **SCOPE)
    assert (outcome.kind, outcome.result, outcome.retry_count) == (
        "replayed", {"charged": 100}, 1
    )
    assert body.calls == 0 and len(asked) == 1
    assert h.run(body, **SCOPE).result == {"charged": 100}
    finish(thread, crashed)


def test_reconciled_not_done_runs_the_body_as_a_takeover(store: Any) -> None:
    effects, clock, asked = Effects(), FakeClock(), []
    h = make_handler(store, clock, on_stuck="reconcile",
                     reconcile=reconciling(Reconciled.not_done(), asked))
    crashed = ThreeSteps(effects, hold_after="email")
    thread = crash_after(h, clock, crashed)
    outcome = h.run(ThreeSteps(effects), **SCOPE)
    assert (outcome.kind, outcome.retry_count) == ("executed", 1)
    assert effects.seen == ["charge", "email", "ledger"]  # the steps still replay
    finish(thread, crashed)


@pytest.mark.parametrize("answer", [Reconciled.unknown("processor says pending"),
                                    RuntimeError("processor unreachable")])
def test_unknown_parks_the_scope_as_uncertain_until_resolved(store: Any, answer: Any) -> None:
    clock, asked = FakeClock(), []
    h = make_handler(store, clock, on_stuck="reconcile", reconcile=reconciling(answer, asked))
    crashed = ThreeSteps(Effects(), hold_after="charge")
    thread = crash_after(h, clock, crashed)
    body = Body()
    outcome = h.run(body, **SCOPE)
    assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.OUTCOME_UNCERTAIN)
    assert ("pending" if isinstance(answer, Reconciled) else "unreachable") in outcome.detail
    clock.advance(3600)  # no automatic re-run, whatever time passes
    again = h.run(body, **SCOPE)
    assert (again.error_code, body.calls, len(asked)) == (ErrorCode.OUTCOME_UNCERTAIN, 0, 1)
    record = h.get_record(**SCOPE)
    assert (record.status, record.response) == (Status.UNCERTAIN, None)  # nothing to replay
    assert record.detail is not None and record.detail in outcome.detail  # for the operator
    finish(thread, crashed)


@pytest.mark.parametrize("resolution", ["done", "retry", "fail"])
def test_operators_resolve_an_uncertain_scope(store: Any, resolution: str) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, on_stuck="reconcile",
                     reconcile=reconciling(Reconciled.unknown("?"), []))
    crashed = ThreeSteps(Effects(), hold_after="charge")
    thread = crash_after(h, clock, crashed)
    h.run(Body(), **SCOPE)
    given = {"done": {"done": {"charged": 1}}, "retry": {"retry": True},
             "fail": {"fail": True}}[resolution]
    after = h.resolve(**SCOPE, by="alice", **given)
    body = Body("ran again")
    outcome = h.run(body, **SCOPE)
    if resolution == "done":
        assert (after.status, outcome.kind, outcome.result) == (
            Status.SUCCESS, "replayed", {"charged": 1}
        )
    elif resolution == "retry":
        assert (after, outcome.kind, body.calls) == (None, "executed", 1)
    else:
        assert (after.status, outcome.kind) == (Status.FAILED, "poisoned")
    with pytest.raises(IdempotencyError) as err:
        h.resolve(**SCOPE, by="alice", fail=True)  # nothing UNCERTAIN any more
    assert err.value.code == ErrorCode.RECORD_NOT_FOUND
    finish(thread, crashed)


def test_resolve_takes_exactly_one_resolution() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    with pytest.raises(ConfigurationError):
        h.resolve(**SCOPE, by="alice", retry=True, fail=True)
    with pytest.raises(ConfigurationError):
        h.resolve(**SCOPE, by="alice")


def test_reconcile_needs_a_function() -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyHandler(MemoryStore(), metrics=None, on_stuck="reconcile")


def test_an_async_reconcile_for_a_coroutine_body() -> None:
    clock = FakeClock()

    async def reconcile(ctx: Any) -> Reconciled:
        return Reconciled.done("looked up")

    h = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=5,
                           on_stuck="reconcile", reconcile=reconcile)
    crashed = ThreeSteps(Effects(), hold_after="charge")
    thread = crash_after(h, clock, crashed, lease=5)

    async def body() -> str:
        return "ran"

    outcome = asyncio.run(h.run_async(body, **SCOPE))
    assert (outcome.kind, outcome.result) == ("replayed", "looked up")
    finish(thread, crashed)


def test_a_transactional_body_cannot_use_steps(tmp_path: Any) -> None:
    """Its writes are exactly-once already; a step recorded apart from its transaction could
    outlive writes the transaction rolled back."""
    from idempotent_tasks import SQLStore

    store = SQLStore(f"sqlite:///{tmp_path}/steps.db")
    store.create_schema()
    h = IdempotencyHandler(store, metrics=None)

    def body(conn: Any) -> Any:
        return current_context().step("charge", lambda: 1)

    outcome = h.run(body, transactional=True, **SCOPE)
    assert outcome.kind == "poisoned"
    assert isinstance(outcome.exception, ConfigurationError)
    assert "transactional" in str(outcome.exception)
    store.close()
