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
    create_logger_adapter,
)
from idempotent_tasks.consumers import IdempotentConsumer
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
