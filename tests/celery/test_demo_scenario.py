"""The demo's Celery section: in-process broker and worker, SQLite store, every line ok."""

from __future__ import annotations

import time
from pathlib import Path

from idempotent_tasks.demo._report import ScenarioLine
from idempotent_tasks.demo.celery_scenario import run_scenario


def test_celery_scenarios_all_behave_as_guaranteed(tmp_path: Path) -> None:
    started = time.monotonic()
    lines = run_scenario(f"sqlite:///{tmp_path / 'demo.db'}", tmp_path / "work")
    elapsed = time.monotonic() - started
    assert all(isinstance(line, ScenarioLine) for line in lines)
    assert [line.scenario for line in lines] == [
        "duplicate deliveries", "concurrent duplicates", "permanent failure", "flaky task",
        "worker crash",
    ]
    failed = [line for line in lines if not line.ok]
    assert not failed, failed
    assert [(line.deliveries, line.executions) for line in lines] == [
        (4, 1), (3, 1), (2, 1), (1, 3), (1, 1),
    ]
    assert lines[4].details == {"status": "SUCCESS", "retry_count": 1, "recovered": 1}
    assert elapsed < 15


def test_the_demo_can_run_twice_on_the_same_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    for _ in range(2):
        assert all(line.ok for line in run_scenario(url, tmp_path / "work"))
