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
from idempotent_tasks.stores.urls import store_from_url

from .._services import POSTGRES_URL, REDIS_URL, require
from ..conftest import drop_store, unique_prefix

CORE_SCENARIOS = (
    "sequential duplicates", "concurrent duplicates", "tenant isolation", "key reused",
    "permanent failure", "transient failures", "crashed worker, maintenance",
    "crashed worker, redelivery", "stalled worker loses its lease", "record expired",
    "operator unpoison",
)


def flat(out: str) -> str:
    """The report with its 80-column wrapping undone (rich wraps at spaces)."""
    return " ".join(out.split())


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
    for label in ("bodies run", "ran to success", "replayed a stored result",
                  "scopes poisoned", "crashed attempts recovered", "outlived its lease"):
        assert label in out
    for metric in ("executions_total", "duplicates_total", "poisoned_total",
                   "recovered_total", "lease_lost_total"):
        assert metric in out
    assert "Store stats" in out and "demo.core.charge" in out
    # stdout is a pipe and COLUMNS says 200: the report still fits an 80-column terminal
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
    assert not list(tmp_path.iterdir())  # nothing left in the cwd
    # The framework sections run whenever their modules are installed.
    for name, title in (("celery", "Celery (a real worker"), ("dramatiq", "Dramatiq (a real")):
        if _present(f"idempotent_tasks.demo.{name}_scenario"):
            assert f"skipped {name}" not in out
            assert re.search(rf"^{re.escape(title)}", out, re.M), f"no {name} rows"
            assert f"demo.{name}.charge" in out  # its store-stats rows say whose they are
        else:
            assert (f"skipped {name}: its scenario module is not part of this installation"
                    in flat(out))


def test_python_m_demo_on_a_memory_store() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "idempotent_tasks.demo", "--store", "memory://"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo OK: all 12 scenarios" in proc.stdout
    assert "skipped celery: its workers need a store they can share" in flat(proc.stdout)


def _fake_section(monkeypatch: pytest.MonkeyPatch, name: str, runner: object) -> None:
    module = types.ModuleType(f"fake_{name}_scenario")
    module.run_scenario = runner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)


def _only(monkeypatch: pytest.MonkeyPatch, *sections: tuple[str, str, str]) -> None:
    monkeypatch.setattr(demo_run, "INTEGRATIONS", sections)


def test_a_line_that_is_not_ok_fails_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(store_url: str, workdir: Path, **options: object) -> list[ScenarioLine]:
        assert workdir.is_dir()
        return [ScenarioLine("fake", "duplicate deliveries", 2, 2, "ran twice", False)]

    _fake_section(monkeypatch, "bad", broken)
    _only(monkeypatch, ("fake", "fake_bad_scenario", "fake"))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "demo FAILED: 1 of 13 scenarios did not behave as guaranteed" in out
    assert "fake/duplicate deliveries" in out


def test_crashing_and_missing_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    def crashes(store_url: str, workdir: Path, **options: object) -> list[ScenarioLine]:
        raise RuntimeError("worker did not start")

    _fake_section(monkeypatch, "crash", crashes)
    _only(
        monkeypatch,
        ("crashy", "fake_crash_scenario", "crashy"),
        ("absent", "fake_absent_scenario_xyz", "absent"),
    )
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "section crashed" in out and "worker did not start" in out
    assert "skipped absent: its scenario module is not part of this installation" in out


def test_missing_framework_is_skipped_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "fake_needs_framework.py").write_text(
        "import framework_that_is_not_installed_xyz\n"
        "def run_scenario(store_url, workdir, **options):\n    return []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _only(monkeypatch, ("fw", "fake_needs_framework", "fw"))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    assert ("skipped fw: framework_that_is_not_installed_xyz is not installed: "
            "pip install 'idempotent-tasks[fw]'") in flat(result.stdout)


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
    prefix = unique_prefix("demo")
    try:
        result = CliRunner().invoke(cli, ["--store", POSTGRES_URL, "--prefix", prefix, "demo"])
        assert result.exit_code == 0, result.output
        assert "store: postgresql+psycopg://" in result.stdout and prefix in result.stdout
        assert "demo OK: all 12 scenarios" in result.stdout
    finally:
        drop_store(store_from_url(POSTGRES_URL, prefix=prefix))


def _demo(*args: str, columns: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("idempotent-tasks")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": str(columns)},
    )


def _table_rows(out: str) -> list[tuple[int, int]]:
    """(sent, ran) of every scenario row of the "What happened" table."""
    table = out.split("What happened", 1)[1].split("Totals of all", 1)[0]
    return [(int(m[1]), int(m[2])) for m in re.finditer(r" (\d+) +(\d+) +(?:yes|NO)\s*$",
                                                          table, re.M)]


def _totals(out: str) -> dict[str, int]:
    section = out.split("Totals of all", 1)[1].split("Store stats", 1)[0]
    return {m[1].strip(): int(m[2])
            for m in re.finditer(r"^(\S.*?|  \S.*?) {2,}(\d+)(?: |$)", section, re.M)}


def test_demo_fits_80_columns_and_its_totals_add_up(tmp_path: Path) -> None:
    """A new user's terminal: every line within 80 columns, the title whole, and totals
    that cover every section (Dramatiq included) and add up to the table's rows."""
    proc = _demo("demo", columns=80, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert len(lines) < 130
    assert "idempotent-tasks demo" in lines[0]
    sections = ("core", *(n for n in ("celery", "dramatiq")
                          if _present(f"idempotent_tasks.demo.{n}_scenario")))
    rows = _table_rows(out)
    assert len(rows) == 12 + 5 * (len(sections) - 1)
    assert f"Totals of all {len(rows)} scenarios ({', '.join(sections)})" in out
    totals = _totals(out)
    assert totals["deliveries sent"] == sum(sent for sent, _ in rows)
    assert totals["bodies run"] == sum(ran for _, ran in rows)
    assert totals["bodies run"] == (totals["ran to success"] + totals["failed permanently"]
                                    + totals["failed transiently"] + totals["outlived its lease"])
    assert f"The metrics count {totals['bodies run']} bodies run" in out
    # every row that ran its body more often than it was sent says why
    table = out.split("What happened", 1)[1].split("Totals of all", 1)[0]
    more = [m for m in re.finditer(r"^(\S.*?) +(\d+) +(\d+) +yes\n((?:  .*\n)+)", table, re.M)
            if int(m[3]) > int(m[2])]
    assert len(more) == len(sections) - 1  # Celery's flaky task, Dramatiq's flaky actor
    for m in more:
        assert re.search(r"ran \dx for 1 message: \w+'?s? (?:retried|Retries re-sent)", m[4]), m[0]
    assert "CollectorRegistry" not in out


def test_the_metrics_must_agree_with_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A section whose rows claim runs the metrics never saw fails the demo."""
    def claims_a_run(store_url: str, workdir: Path, **options: object) -> list[ScenarioLine]:
        return [ScenarioLine("fake", "a run no metric saw", 1, 1, "ran once", True)]

    _fake_section(monkeypatch, "liar", claims_a_run)
    _only(monkeypatch, ("fake", "fake_liar_scenario", "fake"))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1, result.output
    assert "the metrics counted 19 bodies run, the rows 20" in " ".join(result.stdout.split())


def test_demo_on_redis_runs_every_section(tmp_path: Path) -> None:
    """The Dramatiq section used to assume a SQL store ("unsupported SQLStore URL scheme")."""
    require("redis")
    prefix = unique_prefix("demo")
    try:
        proc = _demo("--store", REDIS_URL, "--prefix", prefix, "demo", columns=100, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "section crashed" not in proc.stdout
        assert re.search(r"demo OK: all \d+ scenarios", proc.stdout)
    finally:
        drop_store(store_from_url(REDIS_URL, prefix=prefix))
