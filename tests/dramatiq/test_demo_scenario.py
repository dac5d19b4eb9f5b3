"""``idempotent-tasks demo``'s Dramatiq scenarios: SQLite + StubBroker + a real Worker."""

from __future__ import annotations

import time
from pathlib import Path

from idempotent_tasks.demo.dramatiq_scenario import run_scenario


def test_demo_scenarios_hold_their_guarantees_and_are_rerunnable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    started = time.monotonic()
    lines = run_scenario(url, tmp_path)
    elapsed = time.monotonic() - started

    by_name = {line.scenario: line for line in lines}
    assert [line.integration for line in lines] == ["dramatiq"] * 5
    assert (by_name["duplicate deliveries"].deliveries, by_name["duplicate deliveries"].executions) == (4, 1)
    assert by_name["concurrent duplicates"].executions == 1
    assert by_name["concurrent duplicates"].details["in_progress_retries"] == 2
    assert by_name["permanent failure"].executions == 1
    assert by_name["flaky actor"].executions == 3
    assert by_name["flaky actor"].details == {"status": "FAILED", "retry_count": 3}
    assert by_name["worker crash"].details == {"status": "SUCCESS", "retry_count": 1}
    assert all(line.ok for line in lines), lines
    assert elapsed < 15

    again = run_scenario(url, tmp_path)  # same store: fresh keys, same guarantees
    assert all(line.ok for line in again), again
