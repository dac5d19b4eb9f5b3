"""SQLite's spelling of the records table (``stores/sql/_schema.py``): the status check as a
chain of equalities (a constant ``IN`` list costs SQLite a temporary b-tree per row written),
refusing what the ``IN`` form refuses."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from idempotent_tasks import SQLStore, Status

from ..conftest import unique_prefix


def test_the_sqlite_status_check_admits_every_status_and_nothing_else(tmp_path: Path) -> None:
    prefix = unique_prefix("ss")
    store = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}", table_prefix=prefix)
    store.create_schema()
    conn = sqlite3.connect(tmp_path / "idem.db", isolation_level=None)
    try:
        sql = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (f"{prefix}_records",)
        ).fetchone()[0]
        assert " IN (" not in sql and "status = 'UNCERTAIN'" in sql
        insert = (
            f"INSERT INTO {prefix}_records (tenant, operation, key, status, request_hash, "
            "fencing_token, created_at, updated_at) VALUES ('t', 'o', ?, ?, 'h', 1, 1.0, 1.0)"
        )
        for status in Status:
            conn.execute(insert, (status.value, status.value))
        for wrong in ("DONE", "success", ""):
            with pytest.raises(sqlite3.IntegrityError, match="status_ck"):
                conn.execute(insert, (f"k-{wrong}", wrong))
    finally:
        conn.close()
        store.drop_schema()
        store.close()
