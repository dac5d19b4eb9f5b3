"""The demo end to end (the real console script), and its verdict logic."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from idempotent_tasks.cli import cli
from idempotent_tasks.demo import ScenarioLine
from idempotent_tasks.demo import run as demo_run

from .._services import POSTGRES_URL, require

CORE_SCENARIOS = (
    "sequential duplicates", "concurrent duplicates", "tenant isolation", "key reused",
    "permanent failure", "transient failures", "crashed worker, maintenance",
    "crashed worker, redelivery", "stalled worker loses its lease", "record expired",
    "operator unpoison",
)


def _present(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_demo_end_to_end_on_embedded_sqlite(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("idempotent-tasks")
    started = time.monotonic()
    proc = subprocess.run(
        [str(exe), "demo"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert elapsed < 60
    assert "Traceback" not in out + proc.stderr
    for scenario in CORE_SCENARIOS:
        assert scenario in out
    assert re.search(r"demo OK: all \d+ scenarios behaved as guaranteed", out)
    assert "NO" not in re.findall(r"\b(?:yes|NO)\b", out)
    for label in ("bodies run to success", "replayed (duplicate of a SUCCESS)", "poisoned",
                  "recovered by maintenance", "stale owners refused (lease lost)"):
        assert label in out
    for metric in ("idempotency_executions_total", "idempotency_duplicates_total",
                   "idempotency_poisoned_total", "idempotency_recovered_total",
                   "idempotency_lease_lost_total"):
        assert metric in out
    assert "Store stats" in out and "demo.core.charge" in out
    assert not list(tmp_path.iterdir())  # nothing left in the cwd
    # The framework sections run whenever their modules are installed.
    for name in ("celery", "dramatiq"):
        if _present(f"idempotent_tasks.demo.{name}_scenario"):
            assert f"skipped {name}" not in out
            assert re.search(rf"^│ {name}\s+│", out, re.M), f"no {name} rows"
        else:
            assert f"skipped {name}: its scenario module is not part of this installation" in out


def test_python_m_demo_on_a_memory_store() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "idempotent_tasks.demo", "--store", "memory://"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo OK: all 12 scenarios" in proc.stdout
    assert "skipped celery: its workers need a store they can share" in proc.stdout


def _fake_section(monkeypatch: pytest.MonkeyPatch, name: str, runner: object) -> None:
    module = types.ModuleType(f"fake_{name}_scenario")
    module.run_scenario = runner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)


def _only(monkeypatch: pytest.MonkeyPatch, *sections: tuple[str, str, str]) -> None:
    monkeypatch.setattr(demo_run, "INTEGRATIONS", sections)


def test_a_line_that_is_not_ok_fails_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(store_url: str, workdir: Path) -> list[ScenarioLine]:
        assert workdir.is_dir()
        return [ScenarioLine("fake", "duplicate deliveries", 2, 2, "ran twice", False)]

    _fake_section(monkeypatch, "bad", broken)
    _only(monkeypatch, ("fake", "fake_bad_scenario", "fake"))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1
    assert "demo FAILED: 1 of 13 scenarios did not behave as guaranteed" in result.stdout
    assert "fake/duplicate deliveries" in result.stdout


def test_crashing_and_missing_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    def crashes(store_url: str, workdir: Path) -> list[ScenarioLine]:
        raise RuntimeError("worker did not start")

    _fake_section(monkeypatch, "crash", crashes)
    _only(
        monkeypatch,
        ("crashy", "fake_crash_scenario", "crashy"),
        ("absent", "fake_absent_scenario_xyz", "absent"),
    )
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1
    assert "section crashed" in result.stdout and "worker did not start" in result.stdout
    assert "skipped absent: its scenario module is not part of this installation" in result.stdout


def test_missing_framework_is_skipped_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "fake_needs_framework.py").write_text(
        "import framework_that_is_not_installed_xyz\n"
        "def run_scenario(store_url, workdir):\n    return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _only(monkeypatch, ("fw", "fake_needs_framework", "fw"))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    assert ("skipped fw: framework_that_is_not_installed_xyz is not installed: "
            "pip install 'idempotent-tasks[fw]'") in result.stdout


def test_keep_leaves_the_workdir(monkeypatch: pytest.MonkeyPatch) -> None:
    _only(monkeypatch)
    kept = CliRunner().invoke(cli, ["demo", "--keep"])
    assert kept.exit_code == 0, kept.output
    workdir = Path(re.search(r"kept (\S+)", kept.stdout).group(1))  # type: ignore[union-attr]
    assert (workdir / "demo.db").is_file()
    import shutil

    shutil.rmtree(workdir)
    gone = CliRunner().invoke(cli, ["demo"])
    assert gone.exit_code == 0
    path = re.search(r"workdir: (\S+)", gone.stdout).group(1)  # type: ignore[union-attr]
    assert not Path(path).exists()


def test_demo_on_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    require("postgres")
    _only(monkeypatch)  # the core section only: the framework sections run in the e2e test
    result = CliRunner().invoke(cli, ["--store", POSTGRES_URL, "demo"])
    assert result.exit_code == 0, result.output
    assert "store: postgresql+psycopg://" in result.stdout
    assert "demo OK: all 12 scenarios" in result.stdout
