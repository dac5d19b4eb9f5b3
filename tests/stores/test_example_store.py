"""``StoreContract`` on the third-party example store (examples/custom_store), and proof that
the contract can fail: a deliberately broken variant of that store, run through pytest in a
subprocess, fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks.testing import StoreContract

from .._wait import budget

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_store"


def _example_module() -> Any:
    """examples/custom_store/sqlite3_store.py, imported from its file (it is no package)."""
    spec = importlib.util.spec_from_file_location("sqlite3_store", EXAMPLE / "sqlite3_store.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SQLiteStore = _example_module().SQLiteStore


class TestExampleSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        store = SQLiteStore(str(tmp_path / "idem.db"), prefix="example")
        store.create_schema()
        yield store
        store.drop_schema()
        store.close()


#: Each a subclass of the example store that breaks one rule, and a rule that must catch it.
BROKEN = {
    "release_resets_the_counter": (
        """
        def release(self, scope, *, token):
            released = super().release(scope, token=token)
            self.reset_retry_count(scope)  # breaks: counters outlive their records
            return released
        """,
        "test_release_keeps_counter_and_allows_recreate",
    ),
    "mark_success_ignores_the_token": (
        """
        def mark_success(self, scope, *, token, response, now, expires_at):
            record = self.get(scope)  # breaks: a stale owner's write is not refused
            token = record.fencing_token if record is not None else token
            return super().mark_success(scope, token=token, response=response, now=now,
                                        expires_at=expires_at)
        """,
        "test_take_over_needs_expired_lease_and_expected_token",
    ),
    "reopen_keeps_the_counter": (
        """
        def reopen(self, scope, *, expected_token, now, lease_expires_at):
            count = self.get_retry_count(scope)
            token = super().reopen(scope, expected_token=expected_token, now=now,
                                   lease_expires_at=lease_expires_at)
            with self._tx() as conn:  # breaks: a new execution must count afresh
                conn.execute(f"INSERT INTO {self.counters} VALUES (?, ?, ?, ?, ?)",
                             (*scope, count, now))
            return token
        """,
        "test_reopen_gives_a_success_record_to_a_new_attempt",
    ),
}

SUITE = '''
import sys
import pytest
from idempotent_tasks.testing import StoreContract

sys.path.insert(0, {example!r})
from sqlite3_store import SQLiteStore


class BrokenStore(SQLiteStore):
{method}


class TestBrokenStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        store = BrokenStore(str(tmp_path / "idem.db"))
        store.create_schema()
        yield store
        store.close()
'''


@pytest.mark.parametrize("flaw", sorted(BROKEN))
def test_the_contract_fails_a_broken_store(flaw: str, tmp_path: Path) -> None:
    method, caught_by = BROKEN[flaw]
    suite = tmp_path / "test_broken_store.py"
    suite.write_text(SUITE.format(example=str(EXAMPLE),
                                  method=textwrap.indent(textwrap.dedent(method), "    ")))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery",
         "-p", "no:randomly", str(suite)],
        cwd=tmp_path, capture_output=True, text=True, timeout=budget(300), check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # 1: tests ran and some failed (not a usage error)
    assert f"FAILED test_broken_store.py::TestBrokenStore::{caught_by}" in out, out
    assert " passed" in out, out  # the rest of the contract ran, and the sound rules passed
