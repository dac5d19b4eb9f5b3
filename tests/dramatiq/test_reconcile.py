"""``reconcile=`` as an ``@idempotent_actor(...)`` option, against StubBroker and a real
in-process Worker: registered as the actor's operation default; after a crashed attempt
(``simulate_crash``: the record a SIGKILLed worker leaves) whose lease expired, ``done`` is the
message's result with the body not run again, ``unknown`` dead-letters the message with
``OUTCOME_UNCERTAIN`` and leaves the record UNCERTAIN.  The real-worker versions are in
test_effects_worker.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idempotent_tasks import ErrorCode, IdempotencyContext, Reconciled, Status
from idempotent_tasks.dramatiq import get_context, idempotent_actor
from idempotent_tasks.testing import FakeClock, simulate_crash

from .conftest import Env, close_env, make_env

LEASE = 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timed(clock: FakeClock) -> Iterator[Env]:
    e = make_env(handler_kwargs={"clock": clock, "lease_timeout": LEASE})
    yield e
    close_env(e)


def test_reconcile_done_is_the_result_and_unknown_dead_letters(
    timed: Env, clock: FakeClock
) -> None:
    runs: list[int] = []
    answers = {"k-done": Reconciled.done(42), "k-unknown": Reconciled.unknown("no answer")}

    def reconcile(ctx: IdempotencyContext) -> Reconciled:
        return answers[ctx.key]

    @idempotent_actor(on_stuck="reconcile", reconcile=reconcile, payload=lambda n: {"n": n},
                      store_results=True, min_backoff=10, max_backoff=40)
    def charge(n: int) -> int:
        runs.append(n)
        return -1

    assert timed.handler.options_for("charge").reconcile is reconcile
    for k in answers:
        assert isinstance(simulate_crash(timed.handler, operation="charge", tenant="acme",
                                         key=k, payload={"n": 1}), int)
    clock.advance(LEASE + 1)
    timed.start()
    done = charge.send_with_options(args=(1,), idempotency_key="k-done", tenant="acme")
    unknown = charge.send_with_options(args=(1,), idempotency_key="k-unknown", tenant="acme")
    timed.join()
    assert runs == []
    assert done.get_result(backend=timed.backend) == 42
    assert timed.dead_letter_ids() == [unknown.message_id]
    ctx = get_context(timed.broker.dead_letters[0])
    assert ctx is not None and ctx.outcome == "rejected"
    assert timed.observer.errors(ErrorCode.OUTCOME_UNCERTAIN.value)
    record = timed.handler.get_record(operation="charge", tenant="acme", key="k-unknown")
    assert record is not None and record.status is Status.UNCERTAIN
