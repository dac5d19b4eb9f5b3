"""SQLStore on MariaDB (``mysql+pymysql://``): what the shared contract suite does not cover —
the dialect's own statements, locking under concurrency from several processes, its schema,
transactional mode and the CLI.  The contract suite and the model run on it too (the
``mysql`` store kind)."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    SQLStore,
    Status,
    StoreUnavailableError,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import cli
from idempotent_tasks.stores.sql._mysql import MySQLCommon, MySQLOps
from idempotent_tasks.stores.sql._mysql_setup import mysql_ddl
from idempotent_tasks.stores.urls import store_from_url
from idempotent_tasks.testing import FakeClock

from .._wait import budget
from ._backends import free_port, make_mysql_store, mariadb_admin, mysql_url, unique

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mysql_store() -> Iterator[SQLStore]:
    store = make_mysql_store()
    try:
        yield store
    finally:
        store.drop_schema()
        store.close()


def claim(store: SQLStore, scope: Scope = S, now: float = NOW) -> Any:
    return store.create(scope, request_hash="h", now=now, lease_expires_at=now + 30)


# -- URLs, construction, schema ---------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["mysql", "mysql+pymysql", "mariadb+pymysql", "mariadb"])
def test_mysql_urls_mean_pymysql_and_never_connect(scheme: str) -> None:
    store = SQLStore(f"{scheme}://root@127.0.0.1:{free_port()}/nowhere")
    assert store.name == "mysql" and store.engine.dialect.driver == "pymysql"
    with pytest.raises(StoreUnavailableError):  # nothing listens there: fails closed, fast
        store.get(S)
    store.close()


def test_mysql_store_from_url_and_prefix() -> None:
    store = store_from_url(mysql_url(), prefix="idem_url")
    assert isinstance(store, SQLStore) and store.table_prefix == "idem_url"
    store.close()


def test_mysql_schema_never_created_is_a_configuration_error() -> None:
    store = SQLStore(mysql_url(), table_prefix=unique("none"))
    with pytest.raises(ConfigurationError, match="idempotent-tasks migrate"):
        claim(store)
    store.close()


def test_mysql_documented_ddl_is_what_create_schema_emits() -> None:
    ddl = mysql_ddl()
    assert "VARBINARY(1020)" in ddl and "LONGBLOB" in ddl and "AUTO_INCREMENT" in ddl
    assert ddl in (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")


def test_mysql_create_schema_concurrently_and_refuses_a_mismatch() -> None:
    prefix = unique("cc")
    stores = [SQLStore(mysql_url(), table_prefix=prefix) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def create(store: SQLStore) -> None:
        barrier.wait()
        try:
            store.create_schema()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert claim(stores[0]).created
    other = unique("mm")
    with stores[0].engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {other}_records (tenant TEXT, n INT)")
    try:
        with pytest.raises(ConfigurationError, match="does not match"):
            SQLStore(mysql_url(), table_prefix=other).create_schema()
    finally:
        with stores[0].engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {other}_records")
        stores[0].drop_schema()
        for s in stores:
            s.close()


def test_mysql_scope_columns_compare_byte_for_byte(mysql_store: SQLStore) -> None:
    """No collation folds case, accents or trailing spaces (PAD SPACE) into one key."""
    variants = ["k", "K", "k ", " k", "\u00e9", "e\u0301", "E", "\U0001f600"]
    tokens = [claim(mysql_store, Scope("t", "op", v)).record.fencing_token for v in variants]
    assert len(set(tokens)) == len(variants)
    listed = [r.scope.key for r in mysql_store.list_records(tenant="t", limit=50)]
    assert sorted(listed) == sorted(variants)


def test_mysql_tokens_come_from_the_insert_and_duplicates_write_nothing(
    mysql_store: SQLStore,
) -> None:
    first = claim(mysql_store)
    assert first.created
    with mysql_store.engine.connect() as conn:
        before = conn.exec_driver_sql(f"SELECT * FROM {mysql_store.table_prefix}_records").all()
    for _ in range(3):
        assert not claim(mysql_store).created
    with mysql_store.engine.connect() as conn:
        after = conn.exec_driver_sql(f"SELECT * FROM {mysql_store.table_prefix}_records").all()
    assert before == after
    assert mysql_store.release(S, token=first.record.fencing_token)
    assert claim(mysql_store).record.fencing_token > first.record.fencing_token


def test_mysql_a_large_response_round_trips(mysql_store: SQLStore) -> None:
    token = claim(mysql_store).record.fencing_token
    big = bytes(range(256)) * 4096  # 1 MiB: the handler's default max_response_bytes
    assert mysql_store.mark_success(S, token=token, response=big, now=NOW, expires_at=NOW + 9)
    rec = mysql_store.get(S)
    assert rec is not None and rec.response == big


def test_mysql_connections_keep_the_applications_settings(mysql_store: SQLStore) -> None:
    """The store's own statements run autocommit in READ COMMITTED with VARBINARY decoded;
    a connection handed back to the engine's pool is as the application had it."""
    claim(mysql_store)
    mysql_store._raw.drain()
    with mysql_store.engine.connect() as conn:
        dbapi: Any = conn.connection.driver_connection
        assert not dbapi.get_autocommit()
        assert conn.exec_driver_sql("SELECT tenant FROM "
                                    f"{mysql_store.table_prefix}_records").scalar() == b"acme"


# -- concurrency ------------------------------------------------------------------------------
def _claim_rounds(url: str, prefix: str, rounds: int, barrier: Any, out: Any) -> None:
    store = SQLStore(url, table_prefix=prefix)
    won = []
    try:
        for r in range(rounds):
            barrier.wait()
            for key in (f"r{r}", f"r{r}-n"):  # one scope and its neighbour: gap locks
                result = store.create(Scope("t", "op", key), request_hash="h",
                                      now=NOW + r, lease_expires_at=NOW + r + 30)
                if result.created:
                    won.append((key, result.record.fencing_token))
                    if key.endswith("-n"):  # release, so others race the DELETE too
                        store.release(Scope("t", "op", key), token=result.record.fencing_token)
        out.put(("ok", won))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    finally:
        store.close()


def test_mysql_concurrent_claims_from_processes_have_one_winner(mysql_store: SQLStore) -> None:
    """Six processes claim each scope at once (a barrier lines them up), with a neighbouring
    scope claimed and released in the same breath: exactly one winner per scope of a round
    and no deadlock surfacing as an error."""
    ctx = multiprocessing.get_context("fork")
    procs, rounds = 6, 25
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_claim_rounds,
                           args=(mysql_url(), mysql_store.table_prefix, rounds, barrier, out))
               for _ in range(procs)]
    for w in workers:
        w.start()
    answers = [out.get(timeout=budget(120)) for _ in workers]
    for w in workers:
        w.join(budget(30))
    assert all(kind == "ok" for kind, _ in answers), answers
    won = [k for _, keys in answers for k, _tok in keys if not k.endswith("-n")]
    assert sorted(won) == sorted(f"r{r}" for r in range(rounds))
    tokens = [tok for _, keys in answers for _k, tok in keys]
    assert len(tokens) == len(set(tokens))


def test_mysql_deadlock_victims_run_again() -> None:
    """InnoDB may roll back a statement or transaction as a deadlock victim (1213) or after a
    lock wait timeout (1205): nothing changed, so the store runs it again; other errors and
    a victim too many times propagate (then translated into STORE_UNAVAILABLE)."""

    class Deadlock(Exception):
        pass

    class Cursor:
        def __init__(self, fail: int, code: int = 1213) -> None:
            self.fail, self.code, self.rowcount, self.calls = fail, code, 0, 0
            self.connection = self

        def execute(self, sql: str, params: Any) -> None:
            self.calls += 1
            if self.calls <= self.fail:
                raise Deadlock(self.code, "Deadlock found")
            self.rowcount = 1

        def begin(self) -> None: ...
        def commit(self) -> None: ...
        def rollback(self) -> None: ...

    ops = MySQLOps("r", "c", MySQLCommon("r", "c", "l"), Deadlock)
    assert ops._statement(Cursor(2), "x", {}) == 1
    assert ops._transaction(Cursor(4, 1205), lambda c: c.execute("x", {}) or "done") == "done"
    with pytest.raises(Deadlock):
        ops._statement(Cursor(9), "x", {})
    with pytest.raises(Deadlock):
        ops._statement(Cursor(1, 1062), "x", {})  # a duplicate key is not a deadlock


def test_mysql_concurrent_cleanup_purges_each_record_once(mysql_store: SQLStore) -> None:
    for i in range(60):
        token = claim(mysql_store, Scope("t", "op", f"e{i}")).record.fencing_token
        mysql_store.mark_success(Scope("t", "op", f"e{i}"), token=token, response=b"1",
                                 now=NOW, expires_at=NOW + 1)
    counts: list[int] = []
    barrier = threading.Barrier(4)

    def purge() -> None:
        barrier.wait()
        while (n := mysql_store.delete_expired(now=NOW + 5, counters_before=NOW, limit=7)) > 0:
            counts.append(n)

    threads = [threading.Thread(target=purge) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 60 and mysql_store.list_records(limit=100) == []


def test_mysql_lost_connection_fails_closed_then_recovers(mysql_store: SQLStore) -> None:
    claim(mysql_store)
    raw = mysql_store._raw._idle[-1]
    admin = mariadb_admin()
    try:
        admin.cursor().execute(f"KILL {raw.dbapi.thread_id()}")
    finally:
        admin.close()
    with pytest.raises(StoreUnavailableError):
        mysql_store.get(S)
    assert mysql_store.get(S) is not None  # a new connection, no manual step


# -- transactional mode -----------------------------------------------------------------------
@pytest.fixture
def ledger(mysql_store: SQLStore) -> Iterator[sa.Table]:
    table = sa.Table(f"{mysql_store.table_prefix}_ledger", sa.MetaData(),
                     sa.Column("order_id", sa.String(64), primary_key=True),
                     sa.Column("amount", sa.Integer()), mysql_engine="InnoDB")
    table.create(mysql_store.engine)
    yield table
    table.drop(mysql_store.engine)


def _rows(store: SQLStore, table: sa.Table) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(table))]


def test_mysql_transactional_body_commits_with_its_success(
    mysql_store: SQLStore, ledger: sa.Table
) -> None:
    handler = IdempotencyHandler(mysql_store, metrics=None, clock=FakeClock(NOW))
    calls = []

    def body(conn: Any) -> dict[str, int]:
        calls.append(1)
        conn.execute(sa.insert(ledger).values(order_id="o1", amount=100))
        return {"charged": 100}

    for _ in range(3):
        assert handler.execute_in_transaction(body, operation="pay", tenant="t", key="k") == {
            "charged": 100}
    assert calls == [1] and _rows(mysql_store, ledger) == [("o1", 100)]
    assert handler.supports_transactions


def test_mysql_transactional_failure_and_self_commit_roll_back(
    mysql_store: SQLStore, ledger: sa.Table
) -> None:
    handler = IdempotencyHandler(mysql_store, metrics=None, clock=FakeClock(NOW))

    def fails(conn: Any) -> None:
        conn.execute(sa.insert(ledger).values(order_id="o1", amount=1))
        raise RuntimeError("transient")

    with pytest.raises(RuntimeError):
        handler.execute_in_transaction(fails, operation="pay", tenant="t", key="a")
    assert _rows(mysql_store, ledger) == []
    assert handler.retry_count(operation="pay", tenant="t", key="a") == 1

    def commits_itself(conn: Any) -> None:
        conn.execute(sa.insert(ledger).values(order_id="o2", amount=2))
        conn.exec_driver_sql("COMMIT")

    with pytest.raises(IdempotencyError) as err:
        handler.execute_in_transaction(commits_itself, operation="pay", tenant="t", key="b")
    assert err.value.code == ErrorCode.CONFIGURATION_ERROR
    record = handler.get_record(operation="pay", tenant="t", key="b")
    assert record is not None and record.status is Status.FAILED


def test_mysql_stale_owner_rolls_back_its_effects(mysql_store: SQLStore, ledger: sa.Table) -> None:
    token = claim(mysql_store).record.fencing_token
    with mysql_store.body_transaction() as tx:
        tx.connection.execute(sa.insert(ledger).values(order_id="stale", amount=1))
        taken = mysql_store.take_over(S, expected_token=token, now=NOW + 31,
                                      lease_expires_at=NOW + 61)
        assert taken is not None and taken.token > token
        assert not tx.mark_success(S, token=token, response=b"1", now=NOW + 32,
                                   expires_at=NOW + 99)
        tx.rollback()
    assert _rows(mysql_store, ledger) == []


# -- the CLI ----------------------------------------------------------------------------------
def test_mysql_cli_migrate_inspect_and_unpoison() -> None:
    prefix = unique("cli")
    runner = CliRunner()
    args = ["--store", mysql_url(), "--prefix", prefix]
    try:
        result = runner.invoke(cli, [*args, "migrate"])
        assert result.exit_code == 0, result.output
        store = SQLStore(mysql_url(), table_prefix=prefix)
        token = claim(store).record.fencing_token
        store.mark_failed(S, token=token, now=NOW, expires_at=NOW + 10**9)
        shown = runner.invoke(cli, [*args, "inspect", *S, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["status"] == "FAILED"
        done = runner.invoke(cli, [*args, "unpoison", *S, "--yes", "--actor", "test"])
        assert done.exit_code == 0, done.output
        assert store.get(S) is None
    finally:
        store = SQLStore(mysql_url(), table_prefix=prefix)
        store.drop_schema()
        store.close()
