"""The pytest plugin as a user meets it: the examples of docs/testing.md, written into a fresh
project and run by a real ``python -m pytest`` subprocess — on memory, SQLite, PostgreSQL and
Redis (``--idempotency-store``), beside Celery's classic fixtures and beside pytest-celery —
leaving nothing behind in the databases."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from .._services import IN_CI, POSTGRES_URL, REDIS_URL, require
from ._project import doc_examples, run_pytest, write_project

EXAMPLES = doc_examples()
HANDLER = "The handler"
CELERY_CLASSIC = "Celery, with Celery's own pytest fixtures"
PYTEST_CELERY = "Celery, with pytest-celery installed"
DRAMATIQ = "Dramatiq"


def test_the_docs_hold_every_example() -> None:
    assert set(EXAMPLES) == {HANDLER, CELERY_CLASSIC, PYTEST_CELERY, DRAMATIQ}
    assert "conftest.py" in EXAMPLES[CELERY_CLASSIC]
    assert "conftest.py" not in EXAMPLES[PYTEST_CELERY]


# ---------------------------------------------------------------------------- what is left
def _pg_test_tables() -> set[str]:
    import sqlalchemy as sa

    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'test\\_%'"))
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def _redis_test_keys() -> set[bytes]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return set(client.scan_iter(match="test_*:{*", count=1000))
    finally:
        client.close()


def _sqlite_tables(path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        # sqlite_sequence is SQLite's own (the outbox's AUTOINCREMENT ids), not a prefix's
        rows = conn.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return [r[0] for r in rows]


def _store_args(kind: str, project: Path) -> list[str]:
    if kind == "memory":
        return []
    if kind == "sqlite":
        return ["--idempotency-store", f"sqlite:///{project / 'test-idempotency.db'}"]
    require(kind)
    return ["--idempotency-store", POSTGRES_URL if kind == "postgres" else REDIS_URL]


def _one_project(*titles: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for title in titles:
        clash = set(files) & set(EXAMPLES[title])
        assert not clash, f"two examples write {clash}"
        files.update(EXAMPLES[title])
    return files


#: The handler, Celery (classic fixtures) and Dramatiq examples in one user project: 4 tests.
SUITE = (HANDLER, CELERY_CLASSIC, DRAMATIQ)
SUITE_TESTS = 4


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres", "redis"])
def test_the_examples_run_on_every_store_and_leave_nothing(kind: str, tmp_path: Path) -> None:
    project = write_project(tmp_path / "project", _one_project(*SUITE))
    args = _store_args(kind, project)
    before = _pg_test_tables() if kind == "postgres" else set()
    keys_before = _redis_test_keys() if kind == "redis" else set()
    if kind == "redis":  # the Celery example ran on memory, SQLite and PostgreSQL already
        args += ["--ignore", "tests/test_celery_tasks.py"]
    run = run_pytest(project, *args)
    assert run.returncode == 0, run.output
    assert run.passed() == SUITE_TESTS - (kind == "redis"), run.output
    if kind == "sqlite":
        assert _sqlite_tables(project / "test-idempotency.db") == []  # every prefix dropped
    if kind == "postgres":
        assert _pg_test_tables() - before == set()
    if kind == "redis":
        assert _redis_test_keys() - keys_before == set()


# ---------------------------------------------------------------------------- pytest-celery
def _pip_install(python: Path, *requirements: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         "--disable-pip-version-check", *requirements],
        capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def pytest_celery_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An interpreter that sees this virtualenv's packages (the library, Celery, pytest)
    plus pytest-celery and its own dependencies, installed on top by pip — the environment
    of a user who has both plugins."""
    layer = tmp_path_factory.mktemp("pytest-celery-env")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(layer)], check=True, timeout=60)
    python = layer / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "_project_venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    installed = _pip_install(python, "pytest-celery>=1.0")
    if installed.returncode != 0:
        message = f"could not install pytest-celery: {installed.stderr[-2000:]}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    yield python


PLUGINS_CHECK = '''
def test_both_plugins_are_loaded(request):
    manager = request.config.pluginmanager
    assert manager.has_plugin("idempotent_tasks")
    assert manager.has_plugin("celery")  # pytest-celery's entry point
    import pytest_celery  # noqa: F401
'''


def test_beside_pytest_celery(pytest_celery_python: Path, tmp_path: Path) -> None:
    files = {**EXAMPLES[PYTEST_CELERY], "tests/test_plugins_loaded.py": PLUGINS_CHECK}
    project = write_project(tmp_path / "project", files)
    run = run_pytest(project, "--idempotency-store", f"sqlite:///{project / 'i.db'}",
                     python=str(pytest_celery_python))
    assert run.returncode == 0, run.output
    assert run.passed() == 2, run.output


# ---------------------------------------------------------------------------- as a plugin
UNUSED = '''
import sys

def test_nothing_of_the_library_is_needed(request):
    assert request.config.pluginmanager.has_plugin("idempotent_tasks")
    plugin = request.config.pluginmanager.get_plugin("idempotent_tasks")
    assert callable(getattr(plugin, "idempotency_handler", None))
    heavy = {"sqlalchemy", "redis", "psycopg", "celery", "dramatiq", "kombu",
             "confluent_kafka", "prometheus_client"}
    assert not heavy & set(sys.modules)
'''


def test_an_unused_plugin_imports_no_driver_or_framework(tmp_path: Path) -> None:
    project = write_project(tmp_path / "project", {"test_other.py": UNUSED})
    run = run_pytest(project)
    assert run.returncode == 0 and run.passed() == 1, run.output
    off = run_pytest(project, "-p", "no:idempotent_tasks", "--fixtures")
    assert off.returncode == 0 and "idempotency_handler" not in off.output, off.output


FAILING = '''
import pytest
from idempotent_tasks.testing import assert_ran_once

class Timeout(Exception):
    pass

@pytest.mark.idempotency(max_retries=5)
def test_a_retried_body_did_not_run_once(idempotency_handler):
    attempts = iter([Timeout("gateway"), None])

    def body():
        exc = next(attempts)
        if exc:
            raise exc
        return "ok"

    with pytest.raises(Timeout):
        idempotency_handler.execute(body, operation="op", tenant="t", key="k")
    assert idempotency_handler.execute(body, operation="op", tenant="t", key="k") == "ok"
    assert_ran_once(idempotency_handler, operation="op", tenant="t", key="k")
'''


def test_assert_ran_once_fails_a_users_test_with_the_reason(tmp_path: Path) -> None:
    project = write_project(tmp_path / "project", {"test_retry.py": FAILING})
    (project / "pytest.ini").write_text(
        "[pytest]\naddopts = -p no:cacheprovider --strict-markers\n")
    run = run_pytest(project)
    assert run.returncode == 1, run.output
    assert "1 failed" in run.output
    assert ("succeeded after 1 counted failed or crashed attempt(s): its body ran up to 2 "
            "times") in run.output


INI_STORE = '''
from idempotent_tasks.stores.sql import SQLStore

def test_the_ini_option_picks_the_store(idempotency_store):
    assert isinstance(idempotency_store, SQLStore)
    assert idempotency_store.table_prefix.startswith("test_")
'''


def test_the_store_from_the_ini_file(tmp_path: Path) -> None:
    project = write_project(tmp_path / "project", {"test_ini.py": INI_STORE})
    (project / "pytest.ini").write_text(
        "[pytest]\naddopts = -p no:cacheprovider\n"
        f"idempotency_store = sqlite:///{project / 'ini.db'}\n")
    run = run_pytest(project)
    assert run.returncode == 0 and run.passed() == 1, run.output


def test_this_repository_defines_none_of_the_plugins_fixtures() -> None:
    """The plugin is loaded in this project's own runs too: no name may clash."""
    tests = Path(__file__).resolve().parents[1]
    for conftest in tests.rglob("conftest.py"):
        text = conftest.read_text()
        for name in ("def idempotency_store", "def idempotency_handler",
                     "def idempotency_clock"):
            assert name not in text, conftest
    assert os.environ.get("PYTEST_PLUGINS", "").find("idempotent_tasks") == -1
