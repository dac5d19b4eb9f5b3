"""The per-operation policies as ``IdempotentConsumer(...)`` options: registered as the
operation's defaults, applied by ``process`` and ``process_batch`` (a duplicate of a success
under ``on_success="reject"`` is ``rejected`` with ``DUPLICATE_REJECTED`` — a dead letter for
the loops), a waiting duplicate gets the running message's result, a bad value fails at
construction."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    MemoryStore,
    Reconciled,
    Status,
    create_logger_adapter,
)
from idempotent_tasks.consumers import IdempotentConsumer
from idempotent_tasks.testing import FakeClock, simulate_crash
from tests._wait import budget

from .test_consumer import Recorder, msg


def consumer(handler: IdempotencyHandler | None = None, **kwargs: Any) -> IdempotentConsumer:
    handler = handler or IdempotencyHandler(MemoryStore(), metrics=None)
    return IdempotentConsumer(handler, operation="orders.created", default_tenant="acme",
                              **kwargs)


def test_on_success_reject_makes_a_duplicate_a_dead_letter() -> None:
    c = consumer(on_success="reject", reuse_after=600, on_failure="allow_new_attempt")
    o = c.handler.options_for("orders.created")
    assert (o.on_success, o.reuse_after, o.on_failure) == ("reject", 600, "allow_new_attempt")
    body = Recorder()
    first = c.process(msg({"n": 1}), body)
    second = c.process(msg({"n": 1}), body)
    batch = c.process_batch([msg({"n": 1}), msg({"n": 2}, key="k-2")], body)
    assert first.kind == "executed"
    for refused in (second, batch[0]):
        assert refused.kind == "rejected" and refused.error_code is ErrorCode.DUPLICATE_REJECTED
        assert refused.dead_letter and not refused.retry
    assert batch[1].kind == "executed"
    assert sum(body.runs.values()) == 2


def test_a_waiting_duplicate_gets_the_running_messages_result() -> None:
    """The first message is held in its body; the duplicate waits (the handler logs
    ``duplicate_waiting``) and, once the first returns, answers with its result."""
    waiting = threading.Event()

    def on_event(level: str, message: str, fields: Mapping[str, Any]) -> None:
        if message == "duplicate_waiting":
            waiting.set()

    handler = IdempotencyHandler(MemoryStore(), metrics=None,
                                 logger=create_logger_adapter(on_event))
    c = consumer(handler, on_in_progress="wait", wait_timeout=budget(20))
    entered, release = threading.Event(), threading.Event()
    runs: list[Any] = []

    def held(payload: Any) -> dict[str, Any]:
        runs.append(payload)
        entered.set()
        assert release.wait(budget(10))
        return {"ok": payload}

    outcomes: dict[str, Any] = {}
    first = threading.Thread(target=lambda: outcomes.update(first=c.process(msg(), held)))
    first.start()
    dup = threading.Thread(target=lambda: outcomes.update(dup=c.process(msg(), held)))
    try:
        assert entered.wait(budget(10))
        dup.start()
        assert waiting.wait(budget(10))
    finally:
        release.set()
    first.join(budget(10))
    dup.join(budget(30))
    assert outcomes["first"].kind == "executed"
    assert outcomes["dup"].kind == "replayed"
    assert outcomes["dup"].result == outcomes["first"].result == {"ok": {"n": 1}}
    assert runs == [{"n": 1}]


def test_a_bad_policy_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="on_failure"):
        consumer(on_failure="retry")
    with pytest.raises(ConfigurationError):
        consumer(wait_timeout=-1)


def test_reconcile_after_a_crash_replays_done_and_dead_letters_unknown() -> None:
    """A crashed attempt (``simulate_crash``) whose lease expired: ``reconcile`` is asked
    before the body runs again; ``done`` settles the message with its result, ``unknown``
    makes it a dead letter with ``OUTCOME_UNCERTAIN`` (the record UNCERTAIN), the body never
    runs — through ``process`` and ``process_batch``."""
    clock = FakeClock()
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=30)
    answers = {"k-done": Reconciled.done({"found": True}),
               "k-unknown": Reconciled.unknown("no answer"),
               "k-batch": Reconciled.unknown("no answer either")}
    c = consumer(handler, on_stuck="reconcile", reconcile=lambda ctx: answers[ctx.key])
    assert handler.options_for("orders.created").on_stuck == "reconcile"
    for k in answers:
        crashed = simulate_crash(handler, operation="orders.created", tenant="acme", key=k,
                                 payload={"n": 1})
        assert isinstance(crashed, int)
    clock.advance(31)
    body = Recorder()
    done = c.process(msg({"n": 1}, key="k-done"), body)
    unknown = c.process(msg({"n": 1}, key="k-unknown"), body)
    [batched] = c.process_batch([msg({"n": 1}, key="k-batch")], body)
    assert (done.kind, done.result, done.dead_letter) == ("replayed", {"found": True}, False)
    for refused in (unknown, batched):
        assert refused.kind == "rejected" and refused.error_code is ErrorCode.OUTCOME_UNCERTAIN
        assert refused.dead_letter and not refused.retry
    record = handler.get_record(operation="orders.created", tenant="acme", key="k-unknown")
    assert record is not None and record.status is Status.UNCERTAIN
    assert not body.runs
