"""The per-operation policies — ``on_in_progress``, ``on_success`` / ``reuse_after``,
``on_failure`` — against every store (sync, and async through ``run_async``).

Windows are held open with events (a body that waits for ``finish()``) and observed through
the handler's own log events (``duplicate_waiting``), never hoped for with sleeps."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    MemoryCache,
    MemoryStore,
    Poison,
    Status,
)
from idempotent_tasks.testing import FakeClock

from . import _every_store
from ._every_store import SCOPE, Body, Events, Held, Waiter, make_handler
from ._wait import budget

#: Every test that takes ``store`` runs on every store kind, sync and async.
store = _every_store.store


# ------------------------------------------------------------------ on_in_progress="wait"
def test_a_waiting_duplicate_gets_the_running_attempts_result(store: Any) -> None:
    events = Events()
    h = make_handler(store, FakeClock(), events)
    first = Held(h)
    body = Body()
    waiter = Waiter(h, body, on_in_progress="wait", wait_timeout=budget(20))
    events.wait_for("duplicate_waiting")
    assert first.finish().kind == "executed"
    outcome = waiter.outcome()
    assert (outcome.kind, outcome.result, body.calls) == ("replayed", "first", 0)


def test_a_waiting_duplicate_gets_the_poisoned_outcome(store: Any) -> None:
    events = Events()
    h = make_handler(store, FakeClock(), events, on_in_progress="wait",
                     wait_timeout=budget(20))
    first = Held(h, Poison("card declined"))
    waiter = Waiter(h, Body())
    events.wait_for("duplicate_waiting")
    assert first.finish().kind == "poisoned"
    outcome = waiter.outcome()
    assert (outcome.kind, outcome.error_code) == ("poisoned", ErrorCode.REQUEST_FAILED)


def test_a_waiter_runs_the_body_itself_when_the_first_attempt_released_the_scope(
    store: Any,
) -> None:
    events = Events()
    h = make_handler(store, FakeClock(), events)
    first = Held(h, ConnectionError("transient"))
    body = Body("second")
    waiter = Waiter(h, body, on_in_progress="wait", wait_timeout=budget(20))
    events.wait_for("duplicate_waiting")
    assert first.finish().kind == "failed"
    outcome = waiter.outcome()
    assert (outcome.kind, outcome.result, body.calls) == ("executed", "second", 1)


def test_wait_timeout_ends_the_wait_with_in_progress(store: Any) -> None:
    h = make_handler(store, FakeClock())
    first = Held(h)
    body = Body()
    outcome = h.run(body, on_in_progress="wait", wait_timeout=0.05, **SCOPE)
    assert (outcome.kind, outcome.error_code) == ("in_progress", ErrorCode.REQUEST_IN_PROGRESS)
    assert body.calls == 0
    first.finish()


def test_a_waiter_whose_running_attempt_crashed_answers_in_progress(store: Any) -> None:
    """The running attempt's lease expires while a duplicate waits (its worker is gone, as
    far as the store can tell): the waiter answers ``in_progress`` and does not take the
    scope over — the takeover is a later delivery's, counted as usual."""
    events, clock = Events(), FakeClock()
    h = make_handler(store, clock, events)
    first = Held(h)
    body = Body()
    waiter = Waiter(h, body, on_in_progress="wait", wait_timeout=budget(20))
    events.wait_for("duplicate_waiting")
    clock.advance(31)
    outcome = waiter.outcome()
    assert (outcome.kind, body.calls) == ("in_progress", 0)
    taken = h.run(body, **SCOPE)  # the next delivery takes over, counting the lost attempt
    assert (taken.kind, taken.retry_count, body.calls) == ("executed", 1, 1)
    assert first.finish().kind == "superseded"


def test_waiters_are_bounded_per_process() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None, on_in_progress="wait",
                           wait_timeout=budget(20), max_waiters=0)
    first = Held(h)
    outcome = h.run(Body(), **SCOPE)
    assert outcome.kind == "in_progress"
    first.finish()


def test_the_default_does_not_wait(store: Any) -> None:
    h = make_handler(store, FakeClock())
    first = Held(h)
    assert h.run(Body(), **SCOPE).kind == "in_progress"
    first.finish()


# ------------------------------------------------------------------ on_success / reuse_after
def test_on_success_reject_refuses_a_second_call(store: Any) -> None:
    h = make_handler(store, FakeClock())
    body = Body()
    assert h.run(body, **SCOPE).kind == "executed"
    again = h.run(body, on_success="reject", **SCOPE)
    assert (again.kind, again.error_code, body.calls) == (
        "rejected", ErrorCode.DUPLICATE_REJECTED, 1
    )
    with pytest.raises(Exception) as err:
        again.unwrap()
    assert getattr(err.value, "code", None) == ErrorCode.DUPLICATE_REJECTED
    assert h.run(body, **SCOPE).kind == "replayed"  # the default still replays


def test_reuse_after_allows_one_new_execution_per_window(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, reuse_after=60)
    body = Body()
    first = h.run(body, **SCOPE)
    clock.advance(59)
    assert h.run(body, **SCOPE).kind == "replayed"
    clock.advance(1)
    second = h.run(body, **SCOPE)
    assert (second.kind, body.calls) == ("executed", 2)
    assert second.fencing_token > first.fencing_token
    assert h.run(body, **SCOPE).kind == "replayed"  # a new window started with it
    record = h.get_record(**SCOPE)
    assert (record.status, record.retry_count) == (Status.SUCCESS, 0)


def test_reuse_after_starts_the_counter_again(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, reuse_after=10, max_retries=3)
    assert h.run(Body(ConnectionError("flaky")), **SCOPE).retry_count == 1
    assert h.run(Body(), **SCOPE).kind == "executed"
    clock.advance(10)
    again = h.run(Body(ConnectionError("flaky")), **SCOPE)
    assert (again.kind, again.retry_count) == ("failed", 1)


def test_reject_within_the_window_and_a_new_execution_after_it(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, on_success="reject", reuse_after=60)
    body = Body()
    h.run(body, **SCOPE)
    assert h.run(body, **SCOPE).error_code == ErrorCode.DUPLICATE_REJECTED
    clock.advance(60)
    assert h.run(body, **SCOPE).kind == "executed"


def test_one_of_concurrent_deliveries_reopens_a_settled_scope(store: Any) -> None:
    clock = FakeClock()
    h = make_handler(store, clock, reuse_after=1)
    h.run(Body(), **SCOPE)
    clock.advance(5)
    barrier, lock, kinds = threading.Barrier(6), threading.Lock(), []
    release = threading.Event()

    def body() -> str:
        release.wait(budget(10))  # the winner holds the scope until every loser answered
        return "again"

    def deliver() -> None:
        barrier.wait(budget(10))
        outcome = h.run(body, **SCOPE)
        with lock:
            kinds.append(outcome.kind)
            if len(kinds) == 5:
                release.set()

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(budget(30))
    assert sorted(kinds) == ["executed"] + ["in_progress"] * 5
    assert len(h.get_attempts(**SCOPE)) == 1  # only the delivery that reopened kept the old one


# ------------------------------------------------------------------ on_failure
def test_allow_new_attempt_runs_a_poisoned_scope_again(store: Any) -> None:
    h = make_handler(store, FakeClock(), max_retries=2)
    body = Body(ConnectionError("down"))
    h.run(body, **SCOPE)
    poisoned = h.run(body, **SCOPE)
    assert (poisoned.kind, poisoned.retry_count) == ("poisoned", 2)
    assert h.run(Body(), **SCOPE).kind == "poisoned"  # the default keeps it poisoned
    fixed = Body("fixed")
    again = h.run(fixed, on_failure="allow_new_attempt", **SCOPE)
    assert (again.kind, again.result, fixed.calls) == ("executed", "fixed", 1)
    assert again.fencing_token > poisoned.fencing_token
    record = h.get_record(**SCOPE)
    assert (record.status, record.retry_count) == (Status.SUCCESS, 0)


def test_a_new_attempt_after_failure_counts_afresh(store: Any) -> None:
    h = make_handler(store, FakeClock(), max_retries=2, on_failure="allow_new_attempt")
    h.run(Body(Poison()), **SCOPE)
    again = h.run(Body(ConnectionError("down")), **SCOPE)
    assert (again.kind, again.retry_count) == ("failed", 1)


# ------------------------------------------------------------------ options
def test_policies_per_operation_and_call_site_precedence() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    h.register_operation("reports.build", on_success="reject")
    body = Body()
    h.run(body, **SCOPE)
    assert h.run(body, **SCOPE).kind == "rejected"
    assert h.run(body, on_success="replay", **SCOPE).kind == "replayed"
    assert h.run(body, **{**SCOPE, "operation": "other"}).kind == "executed"


def test_a_cache_never_answers_for_a_policy() -> None:
    h = IdempotencyHandler(MemoryStore(), MemoryCache(), metrics=None)
    body = Body()
    h.run(body, **SCOPE)
    assert h.run(body, **SCOPE).kind == "replayed"  # now cached
    assert h.run(body, on_success="reject", **SCOPE).kind == "rejected"


@pytest.mark.parametrize("options", [
    {"on_in_progress": "block"}, {"on_success": "ignore"}, {"on_failure": "retry"},
    {"wait_timeout": 0}, {"reuse_after": -1},
])
def test_invalid_policies_are_configuration_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyHandler(MemoryStore(), metrics=None, **options)
    h = IdempotencyHandler(MemoryStore(), metrics=None)
    assert h.run(Body(), **SCOPE, **options).error_code == ErrorCode.CONFIGURATION_ERROR


class _WithoutReopen:
    """A store that lacks the optional ``reopen`` primitive (like a store written before it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "reopen":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_without_reopen_refuses_the_reuse_policies() -> None:
    h = IdempotencyHandler(_WithoutReopen(MemoryStore()), metrics=None, reuse_after=0)
    h.run(Body(), **SCOPE)
    outcome = h.run(Body(), **SCOPE)
    assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
