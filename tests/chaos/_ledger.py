"""The ledger (one row per body execution) and the store tables, read by the harness.

Queries tolerate PostgreSQL being restarted under them: a failed query drops the connection
and answers ``None``; the next one reconnects.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import psycopg


class Database:
    """One autocommit connection, re-opened after a failure."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                cur = self._conn.execute(sql, params)
                return cur.fetchall() if cur.description is not None else []
            except psycopg.OperationalError:
                self.close()
                return None

    def must(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        rows = self.query(sql, params)
        if rows is None:
            raise AssertionError(f"PostgreSQL did not answer: {sql}")
        return rows

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Ledger:
    """``<run>_ledger``: no unique constraint, so a double execution shows as two rows."""

    def __init__(self, run_id: str, prefix: str, dsn: str) -> None:
        self.table = f"chaos_{run_id}_ledger"
        self.crash_table = f"chaos_{run_id}_crashes"
        self.records = f"{prefix}_records"
        self.counters = f"{prefix}_retry_counters"
        self.db = Database(dsn)

    def create(self) -> None:
        self.db.must(
            f"CREATE TABLE {self.table} (id BIGSERIAL PRIMARY KEY, profile TEXT NOT NULL, "
            "key TEXT NOT NULL, token TEXT NOT NULL, pid INTEGER NOT NULL)"
        )
        self.db.must(f"CREATE TABLE {self.crash_table} (key TEXT PRIMARY KEY, pid INTEGER)")

    def drop(self) -> None:
        self.db.must(f"DROP TABLE IF EXISTS {self.table}, {self.crash_table}")
        self.db.close()

    def count(self) -> int | None:
        rows = self.db.query(f"SELECT count(*) FROM {self.table}")
        return None if rows is None else int(rows[0][0])

    def rows(self) -> dict[str, dict[str, list[str]]]:
        """profile -> key -> the tokens of its rows, in insertion order."""
        out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for profile, key, token in self.db.must(
            f"SELECT profile, key, token FROM {self.table} ORDER BY id"
        ):
            out[profile][key].append(token)
        return out

    def crashed_keys(self) -> set[str]:
        return {row[0] for row in self.db.must(f"SELECT key FROM {self.crash_table}")}

    def counters_now(self) -> dict[tuple[str, str], int] | None:
        rows = self.db.query(f"SELECT operation, key, count FROM {self.counters}")
        return None if rows is None else {(op, key): int(n) for op, key, n in rows}

    def status_counts(self) -> dict[tuple[str, str], int]:
        rows = self.db.must(
            f"SELECT operation, status, count(*) FROM {self.records} GROUP BY operation, status"
        )
        return {(op, status): int(n) for op, status, n in rows}

    def live_leases(self, now: float) -> int:
        rows = self.db.must(
            f"SELECT count(*) FROM {self.records} WHERE status = 'PROCESSING' "
            "AND lease_expires_at > %s", (now,)
        )
        return int(rows[0][0])
