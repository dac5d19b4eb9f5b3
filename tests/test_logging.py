"""Every decision is logged with key, tenant, operation and status (docs/operations.md), through the
default structlog → stdlib logger and through create_logger_adapter; and a library that the
application did not configure prints nothing."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest

from idempotent_tasks import (
    IdempotencyError,
    IdempotencyHandler,
    MemoryStore,
    create_logger_adapter,
)
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

OP = "payments.charge"
T = "acme"

#: event -> level, for every per-scope decision the handler takes
DECISIONS = {
    "executed": "debug",
    "duplicate_replayed": "debug",
    "duplicate_in_progress": "info",
    "released_for_retry": "info",
    "taken_over": "info",
    "key_reused": "warning",
    "poisoned": "warning",
    "duplicate_poisoned": "warning",
    "lease_lost": "warning",
    "recovered": "warning",
    "unpoisoned": "warning",
}
SCOPE_FIELDS = ("tenant", "operation", "key", "status")


class Declined(Exception):
    pass


def _raise(exc: Exception):  # type: ignore[no-untyped-def]
    def body() -> None:
        raise exc

    return body


def _quiet(fn, *args: Any, **kwargs: Any) -> Any:  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except (IdempotencyError, Declined, TimeoutError):
        return None


def exercise(handler: IdempotencyHandler, clock: FakeClock) -> None:
    """Drive the handler through every decision in DECISIONS, plus a store failure."""
    run = handler.execute
    run(lambda: 1, operation=OP, tenant=T, key="k-ok", payload={"a": 1})  # executed
    run(lambda: 1, operation=OP, tenant=T, key="k-ok", payload={"a": 1})  # replayed
    _quiet(run, lambda: 1, operation=OP, tenant=T, key="k-ok", payload={"a": 2})  # key_reused
    _quiet(run, _raise(Declined()), operation=OP, tenant=T, key="k-perm",
           permanent=(Declined,))  # poisoned
    _quiet(run, lambda: 1, operation=OP, tenant=T, key="k-perm")  # duplicate_poisoned
    _quiet(run, _raise(TimeoutError()), operation=OP, tenant=T, key="k-flaky")  # released
    handler.unpoison(operation=OP, tenant=T, key="k-perm", actor="test")  # unpoisoned

    def stale() -> int:  # a worker holds the scope...
        _quiet(run, lambda: 1, operation=OP, tenant=T, key="k-held")  # duplicate_in_progress
        clock.advance(handler.defaults.lease_timeout + 1)  # ...and stalls past its lease
        run(lambda: 2, operation=OP, tenant=T, key="k-held")  # taken_over, executed
        return 1

    run(stale, operation=OP, tenant=T, key="k-held")  # the stale owner's write: lease_lost

    assert isinstance(simulate_crash(handler, operation=OP, tenant=T, key="k-crashed"), int)
    clock.advance(handler.defaults.lease_timeout + 1)
    assert handler.recover_stuck_records() == 1  # recovered

    assert isinstance(handler._engine.store, FaultyStore)
    handler._engine.store.fail("create")
    _quiet(run, lambda: 1, operation=OP, tenant=T, key="k-down")  # store_unavailable
    handler._engine.store.heal()


def _handler(**kwargs: Any) -> tuple[IdempotencyHandler, FakeClock]:
    clock = FakeClock()
    store = FaultyStore(MemoryStore())
    return (
        IdempotencyHandler(store, clock=clock, metrics=None, lease_timeout=10.0,  # type: ignore[arg-type]
                           outcome_retry_timeout=0.1, **kwargs),
        clock,
    )


def _check(events: list[tuple[str, str, Mapping[str, Any]]]) -> None:
    seen = {event for _, event, _ in events}
    assert set(DECISIONS) <= seen, set(DECISIONS) - seen
    for level, event, fields in events:
        if event in DECISIONS:
            assert level == DECISIONS[event], (event, level)
            for name in SCOPE_FIELDS:
                assert fields.get(name), (event, name, fields)
            assert fields["operation"] == OP and fields["tenant"] == T
            assert str(fields["key"]).startswith("k-")
    down = [f for level, e, f in events if e == "store_unavailable"]
    assert down and all(f["store"] == "memory" and f["call"] == "create" for f in down)
    assert all(level == "error" for level, e, _ in events if e == "store_unavailable")
    maintenance = [level for level, e, _ in events if e in ("recovery_run", "cleanup_run")]
    assert maintenance and set(maintenance) == {"info"}


def test_default_logger_goes_through_stdlib_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="idempotent_tasks")
    handler, clock = _handler()
    exercise(handler, clock)
    records = [r for r in caplog.records if r.name == "idempotent_tasks"]
    events = [
        (r.levelname.lower(), r.idempotency_event, r.idempotency)  # type: ignore[attr-defined]
        for r in records
    ]
    _check(events)
    executed = next(r for r in records if r.idempotency_event == "executed")  # type: ignore[attr-defined]
    message = executed.getMessage()
    assert message.startswith("executed ")
    for part in ("tenant='acme'", "operation='payments.charge'", "key='k-ok'", "status='SUCCESS'"):
        assert part in message


def test_levels_follow_the_applications_logging_setup(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="idempotent_tasks")
    handler, clock = _handler()
    exercise(handler, clock)
    levels = {r.levelname for r in caplog.records if r.name == "idempotent_tasks"}
    assert levels == {"WARNING", "ERROR"}


def test_logger_adapter_receives_every_decision() -> None:
    events: list[tuple[str, str, Mapping[str, Any]]] = []
    handler, clock = _handler(
        logger=create_logger_adapter(lambda level, msg, fields: events.append((level, msg, fields)))
    )
    exercise(handler, clock)
    _check(events)


def test_nothing_is_printed_when_the_app_configures_nothing() -> None:
    script = textwrap.dedent(
        """
        import structlog
        from idempotent_tasks import IdempotencyHandler, MemoryStore
        from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash
        from tests.test_logging import exercise

        clock = FakeClock()
        handler = IdempotencyHandler(FaultyStore(MemoryStore()), clock=clock, lease_timeout=10.0,
                                     outcome_retry_timeout=0.1)
        exercise(handler, clock)
        assert not structlog.is_configured()
        """
    )
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""
