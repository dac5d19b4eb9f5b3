"""A replay is not worth Dramatiq's "Message … was skipped." WARNING; other skips still are.

A real ``dramatiq.Worker`` on a StubBroker: the worker thread itself logs the warning (the
library installs a filter for replays on its logger at worker boot), so this is Dramatiq's own
``SkipMessage`` handling, not a re-creation of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor
from idempotent_tasks.dramatiq._skip_log import (
    REPLAY_SKIP_FILTER,
    is_replay_skip,
    worker_thread_loggers,
)

QUEUE = "replay_skip_log"


@pytest.fixture
def broker() -> Iterator[StubBroker]:
    broker = StubBroker()
    broker.emit_after("process_boot")
    broker.add_middleware(IdempotencyMiddleware(
        IdempotencyHandler(MemoryStore(), metrics=None), default_tenant="t", maintenance=False,
    ))
    yield broker
    broker.close()


def _skip_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("dramatiq.worker") and "was skipped" in r.getMessage()]


def _run(broker: StubBroker, *messages: Any) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        for message in messages:
            broker.enqueue(message)
            broker.join(QUEUE, fail_fast=False, timeout=10_000)
            worker.join()
    finally:
        worker.stop()


def test_a_replay_logs_no_skip_warning_but_an_age_limit_skip_still_does(
    broker: StubBroker, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []

    @idempotent_actor(actor_name="replay_skip_charge", broker=broker, queue_name=QUEUE)
    def charge(order: str) -> str:
        runs.append(order)
        return order

    first = charge.message_with_options(args=("o-1",), idempotency_key="k-1")
    redelivered = first.copy()  # the broker delivers the same message again: a replay
    expired = charge.message_with_options(args=("o-2",), idempotency_key="k-2", max_age=1)
    expired = expired.copy(message_timestamp=0)  # older than max_age: AgeLimit skips it
    with caplog.at_level(logging.DEBUG, logger="dramatiq"):
        _run(broker, first)
        assert _skip_warnings(caplog) == []
        _run(broker, redelivered)
        assert runs == ["o-1"]  # replayed, not run
        assert _skip_warnings(caplog) == []
        _run(broker, expired)
    assert runs == ["o-1"]
    warnings = _skip_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].args[0].message_id == expired.message_id  # type: ignore[index]
    assert warnings[0].name in {lg.name for lg in worker_thread_loggers()}
    assert all(REPLAY_SKIP_FILTER in lg.filters for lg in worker_thread_loggers())


def test_the_filter_matches_only_replayed_messages() -> None:
    class Proxy:
        def __init__(self, outcome: str | None) -> None:
            if outcome is not None:
                self.idempotency_context = type("Ctx", (), {"outcome": outcome})()

    def record(msg: str, *args: Any) -> logging.LogRecord:
        return logging.LogRecord("dramatiq.worker.WorkerThread", logging.WARNING, __file__, 1,
                                 msg, args, None)

    assert is_replay_skip(record("Message %s was skipped.", Proxy("replayed")))
    assert not is_replay_skip(record("Message %s was skipped.", Proxy("executed")))
    assert not is_replay_skip(record("Message %s was skipped.", Proxy(None)))
    assert not is_replay_skip(record("Something else about %s.", Proxy("replayed")))
    assert not is_replay_skip(record("Message %s was skipped."))
