"""Exactly-once effects in one transaction (docs/transactional.md), on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, SQLStore, Status
from idempotent_tasks.testing import FakeClock

from ._services import POSTGRES_URL, require


class Flaky(Exception):
    pass


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(store URL, table prefix)."""
    prefix = f"tx_{uuid.uuid4().hex[:8]}"
    if request.param == "postgres":
        require("postgres")
        return POSTGRES_URL, prefix
    return f"sqlite:///{tmp_path / 'tx.db'}", prefix


@pytest.fixture
def env(sql_url: tuple[str, str]) -> Iterator[tuple[SQLStore, sa.Table]]:
    url, prefix = sql_url
    store = SQLStore(url, table_prefix=prefix)
    store.create_schema()
    md = sa.MetaData()
    ledger = sa.Table(
        f"{prefix}_ledger", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
    )
    md.create_all(store.engine)
    try:
        yield store, ledger
    finally:
        md.drop_all(store.engine)
        store.drop_schema()
        store.close()


def rows(store: SQLStore, ledger: sa.Table) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        return [(r.order_id, r.amount) for r in conn.execute(sa.select(ledger.c.order_id, ledger.c.amount))]


def test_writes_and_success_commit_together(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)
    calls = 0

    def charge(conn: sa.Connection) -> dict[str, bool]:
        nonlocal calls
        calls += 1
        conn.execute(sa.insert(ledger).values(order_id="o1", amount=100))
        return {"charged": True}

    for _ in range(3):
        assert h.execute_in_transaction(
            charge, operation="pay", tenant="t", key="k1", payload={"o": 1}) == {"charged": True}
    assert calls == 1
    assert rows(store, ledger) == [("o1", 100)]
    rec = h.get_record(operation="pay", tenant="t", key="k1")
    assert rec is not None and rec.status is Status.SUCCESS


def test_orm_session_bound_to_the_connection(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)

    def charge(conn: sa.Connection) -> int:
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        session.execute(sa.insert(ledger).values(order_id="orm", amount=5))
        session.flush()
        return 5

    assert h.execute_in_transaction(charge, operation="pay", tenant="t", key="orm") == 5
    assert rows(store, ledger) == [("orm", 5)]


def test_body_that_writes_then_raises_leaves_nothing(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)
    attempts = 0

    def charge(conn: sa.Connection) -> str:
        nonlocal attempts
        attempts += 1
        conn.execute(sa.insert(ledger).values(order_id="o2", amount=attempts))
        if attempts < 3:
            raise Flaky()
        return "ok"

    for _ in range(2):
        with pytest.raises(Flaky):
            h.execute_in_transaction(charge, operation="pay", tenant="t", key="k2")
        assert rows(store, ledger) == []
    assert h.execute_in_transaction(charge, operation="pay", tenant="t", key="k2") == "ok"
    assert rows(store, ledger) == [("o2", 3)]
    rec = h.get_record(operation="pay", tenant="t", key="k2")
    assert rec is not None and rec.retry_count == 2  # the rollbacks never erased a counted failure


def test_permanent_failure_rolls_back_and_poisons(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)

    def charge(conn: sa.Connection) -> None:
        conn.execute(sa.insert(ledger).values(order_id="o3", amount=1))
        raise ValueError("declined")

    with pytest.raises(ValueError):
        h.execute_in_transaction(charge, operation="pay", tenant="t", key="k3", permanent=(ValueError,))
    assert rows(store, ledger) == []
    with pytest.raises(IdempotencyError) as ei:
        h.execute_in_transaction(charge, operation="pay", tenant="t", key="k3", permanent=(ValueError,))
    assert ei.value.code == ErrorCode.REQUEST_FAILED


def test_body_that_commits_itself_is_a_configuration_error(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)

    def rogue(conn: sa.Connection) -> int:
        conn.execute(sa.insert(ledger).values(order_id="rogue", amount=1))
        conn.commit()
        return 1

    with pytest.raises(IdempotencyError) as ei:
        h.execute_in_transaction(rogue, operation="pay", tenant="t", key="k4")
    assert ei.value.code == ErrorCode.CONFIGURATION_ERROR
    rec = h.get_record(operation="pay", tenant="t", key="k4")
    assert rec is not None and rec.status is Status.FAILED


def test_unserializable_result_rolls_back_and_poisons(env: tuple[SQLStore, sa.Table]) -> None:
    store, ledger = env
    h = IdempotencyHandler(store, metrics=None)

    def charge(conn: sa.Connection) -> object:
        conn.execute(sa.insert(ledger).values(order_id="o5", amount=1))
        return object()

    with pytest.raises(IdempotencyError) as ei:
        h.execute_in_transaction(charge, operation="pay", tenant="t", key="k5")
    assert ei.value.code == ErrorCode.RESPONSE_NOT_SERIALIZABLE
    assert rows(store, ledger) == []
    rec = h.get_record(operation="pay", tenant="t", key="k5")
    assert rec is not None and rec.status is Status.FAILED


def test_stale_owner_is_rolled_back_and_answers_as_duplicate(tmp_path: Path) -> None:
    """PostgreSQL only: on SQLite the body's transaction holds the single write lock, so a
    takeover cannot happen while the stale body is still inside it (documented)."""
    require("postgres")
    prefix = f"tx_{uuid.uuid4().hex[:8]}"
    store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    store.create_schema()
    md = sa.MetaData()
    ledger = sa.Table(f"{prefix}_ledger", md, sa.Column("who", sa.String(16)))
    md.create_all(store.engine)
    clock = FakeClock(time.time())
    h = IdempotencyHandler(store, metrics=None, clock=clock, lease_timeout=30)
    started, release = threading.Event(), threading.Event()
    out: list[Any] = []

    def stale(conn: sa.Connection) -> str:
        conn.execute(sa.insert(ledger).values(who="stale"))
        started.set()
        assert release.wait(20)
        return "stale"

    def fresh(conn: sa.Connection) -> str:
        conn.execute(sa.insert(ledger).values(who="fresh"))
        return "fresh"

    t = threading.Thread(target=lambda: out.append(
        h.execute_in_transaction(stale, operation="pay", tenant="t", key="k")))
    try:
        t.start()
        assert started.wait(20)
        clock.advance(31)  # the stale owner is paused past its lease
        assert h.execute_in_transaction(fresh, operation="pay", tenant="t", key="k") == "fresh"
        release.set()
        t.join(20)
        assert out == ["fresh"]  # answered as a duplicate: the winner's result, not its own
        with store.engine.connect() as conn:
            assert [r.who for r in conn.execute(sa.select(ledger.c.who))] == ["fresh"]
        rec = h.get_record(operation="pay", tenant="t", key="k")
        assert rec is not None and rec.retry_count == 1 and rec.response == "fresh"
    finally:
        release.set()
        t.join(20)
        md.drop_all(store.engine)
        store.drop_schema()
        store.close()


_CHILD = textwrap.dedent("""
    import sys, time, pathlib
    import sqlalchemy as sa
    from idempotent_tasks import IdempotencyHandler, SQLStore
    url, prefix, started = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    store = SQLStore(url, table_prefix=prefix)
    ledger = sa.Table(prefix + "_ledger", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                      sa.Column("order_id", sa.String(64)), sa.Column("amount", sa.Integer))
    h = IdempotencyHandler(store, metrics=None, lease_timeout=30)
    def body(conn):
        conn.execute(sa.insert(ledger).values(order_id="killed", amount=1))
        started.write_text("inside")
        time.sleep(600)
    h.execute_in_transaction(body, operation="pay", tenant="t", key="crash")
""")


def test_worker_killed_inside_the_body_leaves_nothing(env: tuple[SQLStore, sa.Table], tmp_path: Path) -> None:
    store, ledger = env
    url = store.engine.url.render_as_string(hide_password=False)
    started = tmp_path / "started"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, store.table_prefix, str(started)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert child.poll() is None, "the worker died before reaching the body"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)  # killed inside the body, before commit
        child.wait(10)
        assert rows(store, ledger) == []
        # The redelivery: once the lease expired (our clock is 31 s ahead), take over and commit.
        h = IdempotencyHandler(store, metrics=None, lease_timeout=30, clock=FakeClock(time.time() + 31))

        def body(conn: sa.Connection) -> str:
            conn.execute(sa.insert(ledger).values(order_id="redelivered", amount=1))
            return "done"

        for _ in range(2):
            assert h.execute_in_transaction(body, operation="pay", tenant="t", key="crash") == "done"
        assert rows(store, ledger) == [("redelivered", 1)]
        rec = h.get_record(operation="pay", tenant="t", key="crash")
        assert rec is not None and rec.retry_count == 1
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
