"""``idempotent-tasks resolve``: settling an UNCERTAIN scope from the command line, audited."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

from idempotent_tasks import Reconciled, Status
from idempotent_tasks.cli import EXIT_RECORD_NOT_FOUND, EXIT_USAGE
from idempotent_tasks.stores.base import Scope
from idempotent_tasks.testing import FakeClock, simulate_crash

from .conftest import OP, TENANT, Seeded


def _uncertain(seeded: Seeded, key: str) -> None:
    """A crashed attempt that reconciliation could not tell: an UNCERTAIN record."""
    clock = FakeClock(time.time())
    h = seeded.handler(clock)
    simulate_crash(h, operation=OP, tenant=TENANT, key=key, lease_timeout=5)
    clock.advance(6)
    outcome = h.run(lambda: "ran", operation=OP, tenant=TENANT, key=key, on_stuck="reconcile",
                    reconcile=lambda ctx: Reconciled.unknown("processor says pending"))
    assert outcome.error_code == "OUTCOME_UNCERTAIN", outcome


def _json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_list_shows_uncertain_records(seeded: Seeded) -> None:
    _uncertain(seeded, "k-uncertain")
    doc = _json(seeded.run("list", "--status", "uncertain", "--json"))
    assert [r["key"] for r in doc["records"]] == ["k-uncertain"]


def test_resolve_done_records_the_result_and_audits(
    seeded: Seeded, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="idempotent_tasks")
    _uncertain(seeded, "k-u1")
    doc = _json(seeded.run("resolve", TENANT, OP, "k-u1", "--done", '{"charged": 5}', "--yes",
                           "--actor", "alice", "--json"))
    assert (doc["resolved"], doc["actor"], doc["record"]["status"]) == (
        "done", "cli:alice", "SUCCESS"
    )
    audit = [r for r in caplog.records if r.getMessage().startswith("uncertain_resolved")]
    assert audit and audit[0].idempotency["by"] == "cli:alice"  # type: ignore[attr-defined]
    assert seeded.handler().execute(lambda: "ran", operation=OP, tenant=TENANT,
                                    key="k-u1") == {"charged": 5}


@pytest.mark.parametrize(("flag", "after"), [("--retry", None), ("--fail", Status.FAILED)])
def test_resolve_retry_and_fail(seeded: Seeded, flag: str, after: Status | None) -> None:
    _uncertain(seeded, "k-u2")
    result = seeded.run("resolve", TENANT, OP, "k-u2", flag, "--yes")
    assert result.exit_code == 0, result.output
    record = seeded.store.get(Scope(TENANT, OP, "k-u2"))
    assert (None if record is None else record.status) == after


def test_resolve_refuses_what_is_not_uncertain(seeded: Seeded) -> None:
    result = seeded.run("resolve", TENANT, OP, "k-success", "--fail", "--yes")
    assert result.exit_code == EXIT_RECORD_NOT_FOUND
    assert "error: RECORD_NOT_FOUND: the scope is SUCCESS, not UNCERTAIN" in result.stderr


@pytest.mark.parametrize("args", [[], ["--retry", "--fail"], ["--done", "{not json"]])
def test_resolve_needs_one_valid_resolution(seeded: Seeded, args: list[str]) -> None:
    _uncertain(seeded, "k-u3")
    result = seeded.run("resolve", TENANT, OP, "k-u3", *args, "--yes")
    assert result.exit_code == EXIT_USAGE, result.output
    record = seeded.store.get(Scope(TENANT, OP, "k-u3"))
    assert record is not None and record.status is Status.UNCERTAIN
