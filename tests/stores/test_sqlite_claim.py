"""SQLite's claim reads first (``stores/sql/_sqlite.py``): a duplicate is one read that takes
no lock, a scope with no record is one insert, and whatever changed between the read and the
insert is settled under the write lock.  The windows between the two statements are forced
by a real cursor that lets a second store act right after the read, never by timing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import SQLStore
from idempotent_tasks._core.records import CreateOutcome, Scope, Status
from idempotent_tasks.stores.sql._statements import claim_params

from ..conftest import unique_prefix

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'idem.db'}"


@pytest.fixture
def prefix() -> str:
    return unique_prefix("sc")


@pytest.fixture
def store(url: str, prefix: str) -> Iterator[SQLStore]:
    made = SQLStore(url, table_prefix=prefix)
    made.create_schema()
    try:
        yield made
    finally:
        made.drop_schema()
        made.close()


@pytest.fixture
def rival(url: str, prefix: str) -> Iterator[SQLStore]:
    """A second store on the same file and tables (another worker)."""
    made = SQLStore(url, table_prefix=prefix)
    try:
        yield made
    finally:
        made.close()


class ActAfterRead:
    """A real ``sqlite3`` cursor of ``store``'s that runs ``act`` once, right after the first
    statement's rows have been read (the claim's read has finished; its insert or its
    locked claim has not started)."""

    def __init__(self, store: SQLStore, act: Callable[[], None]) -> None:
        self.connection: Any = store.engine.raw_connection()
        self.connection.driver_connection.isolation_level = None  # autocommit, as the store
        self._cursor = self.connection.driver_connection.cursor()
        self._act: list[Callable[[], None]] = [act]
        self.statements: list[str] = []

    def execute(self, sql: str, params: Any = ()) -> Any:
        self.statements.append(sql.split(" ", 1)[0])
        return self._cursor.execute(sql, params)

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._cursor.fetchall()
        while self._act:
            self._act.pop()()
        return rows

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)


def claim_on(store: SQLStore, cursor: ActAfterRead, now: float) -> Any:
    ops: Any = store._plans.ops  # type: ignore[attr-defined]  # the SQLite primitives
    try:
        return ops.create(cursor, S, claim_params(S, "h", now, now + 30))
    finally:
        cursor.connection.close()


def test_a_claim_whose_insert_loses_the_race_after_its_read_is_a_duplicate(
    store: SQLStore, rival: SQLStore
) -> None:
    """The read found no record; the rival claims before the insert: the insert does
    nothing and the claim, under the write lock, answers DUPLICATE with the rival's
    attempt."""
    won: list[Any] = []
    cursor = ActAfterRead(store, lambda: won.append(
        rival.create(S, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    ))
    lost = claim_on(store, cursor, NOW)
    assert won[0].outcome is CreateOutcome.CREATED
    assert lost.outcome is CreateOutcome.DUPLICATE
    assert lost.record.fencing_token == won[0].record.fencing_token
    assert cursor.statements == ["SELECT", "INSERT", "BEGIN", "SELECT", "COMMIT"]


def test_an_expired_record_replaced_by_a_rival_after_the_read_is_a_duplicate(
    store: SQLStore, rival: SQLStore
) -> None:
    """The read found an expired record; the rival replaces it first: the claim, under the
    write lock, finds the rival's live attempt and replaces nothing."""
    first = store.create(S, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    token = first.record.fencing_token
    assert store.mark_success(S, token=token, response=b"ok", now=NOW, expires_at=NOW + 60)
    later = NOW + 120  # past expires_at: the record counts as absent
    won: list[Any] = []
    cursor = ActAfterRead(store, lambda: won.append(
        rival.create(S, request_hash="h", now=later, lease_expires_at=later + 30)
    ))
    lost = claim_on(store, cursor, later)
    assert won[0].outcome is CreateOutcome.CREATED and won[0].record.fencing_token > token
    assert lost.outcome is CreateOutcome.DUPLICATE
    assert lost.record.fencing_token == won[0].record.fencing_token
    assert lost.record.status is Status.PROCESSING
    assert cursor.statements == ["SELECT", "BEGIN", "SELECT", "COMMIT"]


def test_an_expired_record_is_replaced_under_the_write_lock(store: SQLStore) -> None:
    first = store.create(S, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    token = first.record.fencing_token
    assert store.mark_success(S, token=token, response=b"ok", now=NOW, expires_at=NOW + 60)
    cursor = ActAfterRead(store, lambda: None)
    again = claim_on(store, cursor, NOW + 120)
    assert again.outcome is CreateOutcome.CREATED and again.record.fencing_token > token
    assert cursor.statements == ["SELECT", "BEGIN", "SELECT", "DELETE", "INSERT", "COMMIT"]


def test_a_replay_is_answered_while_another_connection_holds_the_write_lock(
    url: str, store: SQLStore, prefix: str
) -> None:
    """A duplicate is one read: in WAL mode it neither takes nor waits for the write lock,
    so a replay is answered at once while a body transaction holds the lock (an insert-first
    claim would wait for it, here at most ``connect_timeout``, then fail)."""
    token = store.create(S, request_hash="h", now=NOW, lease_expires_at=NOW + 30).record
    assert store.mark_success(
        S, token=token.fencing_token, response=b"ok", now=NOW, expires_at=NOW + 3600
    )
    impatient = SQLStore(url, table_prefix=prefix, connect_timeout=0.05)
    try:
        with store.body_transaction():  # holds SQLite's write lock until it ends
            replay = impatient.create(S, request_hash="h", now=NOW + 1, lease_expires_at=NOW + 31)
    finally:
        impatient.close()
    assert replay.outcome is CreateOutcome.DUPLICATE
    assert replay.record.status is Status.SUCCESS and replay.record.response == b"ok"
