"""The ledger (one row per body execution) and the store tables, read by the harness.

Queries tolerate PostgreSQL being restarted under them: a failed query drops the connection
and answers ``None``; the next one reconnects.  ``must`` (the drain, the verdict) asks again on
a fresh connection until the server answers: after a restart the suite injected, the first
query on the old connection always fails, and that is the fault the run survives, not an outage
of the harness's own.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg

#: How long ``must`` keeps asking a database that does not answer (a restart takes < 1 s).
RECONNECT_SECONDS = 60.0

Rows = list[tuple[Any, ...]]


def must_answer(query: Callable[[str, tuple[Any, ...]], Rows | None], sql: str,
                params: tuple[Any, ...], server: str) -> Rows:
    """``query`` until it answers (each failure has dropped the connection, so each try
    reconnects); fails once the database stayed silent for ``RECONNECT_SECONDS``."""
    deadline = time.monotonic() + RECONNECT_SECONDS
    while (rows := query(sql, params)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{server} did not answer for {RECONNECT_SECONDS:.0f}s: {sql}")
        time.sleep(0.2)
    return rows


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

    def must(self, sql: str, params: tuple[Any, ...] = ()) -> Rows:
        return must_answer(self.query, sql, params, "PostgreSQL")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Ledger:
    """``<run>_ledger``: no unique constraint on the key, so a double execution shows as two
    rows; ``dkey`` (unique, NULL but for the ``plain_steps`` body) is the downstream
    idempotency key a body may send with its insert."""

    def __init__(self, run_id: str, prefix: str, dsn: str) -> None:
        self.table = f"chaos_{run_id}_ledger"
        self.crash_table = f"chaos_{run_id}_crashes"
        self.records = f"{prefix}_records"
        self.counters = f"{prefix}_retry_counters"
        self.db = Database(dsn)

    def create(self) -> None:
        self.db.must(
            f"CREATE TABLE {self.table} (id BIGSERIAL PRIMARY KEY, profile TEXT NOT NULL, "
            "key TEXT NOT NULL, token TEXT NOT NULL, pid INTEGER NOT NULL, dkey TEXT UNIQUE)"
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
