"""PostgreSQL failover: which recorded outcomes survive the promotion of a streaming standby.

A private primary and a standby of the test's own (``tests/_pg_replication.py``: ``initdb``,
``pg_basebackup -R`` through a :class:`tests._proxy.TCPProxy`, free loopback ports; the
machine's PostgreSQL on 5432 is never touched).  The test keeps a ledger of body executions
per scope; "recorded" means the handler returned the body's result (SUCCESS committed).
Replication is cut deterministically by the proxy, never by timing; the primary is stopped
(``immediate``) and the standby promoted (``pg_ctl promote``), each step verified.

* **asynchronous replication** (PostgreSQL's default): the deliveries made while replication
  is cut are acknowledged by the primary alone; after the promotion their records do not
  exist and redelivery runs each of those bodies **again** — re-runs no retry counter shows.
* **synchronous replication** (``synchronous_standby_names`` naming the standby,
  ``synchronous_commit = on``): every acknowledged delivery is on the standby at the moment
  it returned, so replication is cut right after (no catch-up wait) and redelivery on the
  promoted standby runs **no** body again.  A delivery attempted while replication is cut is
  never acknowledged: its claim's commit waits for the standby (seen in ``SyncRep``) until
  the store's ``socket_timeout`` fails it closed (``STORE_UNAVAILABLE``, the body not run).

Plus :func:`~idempotent_tasks.stores.sql._replication.check_synchronous_replication` (and its
async twin) against a private server configured each way.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psycopg
import pytest
from psycopg import sql

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    SQLStore,
    Status,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.sql._replication import (
    acheck_synchronous_replication,
    check_synchronous_replication,
)
from tests._pg_replication import (
    STANDBY_NAME,
    Cluster,
    connect,
    replicated_pair,
    scalar,
    standalone_server,
)
from tests._wait import wait_until

from .conftest import unique_prefix

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

OP, TENANT = "payments.charge", "acme"
DELIVERIES = 20
#: Asynchronous case: the last deliveries, made while replication is cut.
STALLED = 8
#: The synchronous case's blocked delivery: the store's deadline for a statement.
BLOCKED_TIMEOUT = 1.0


class Ledger:
    """Body executions per key, kept by the test (outside any store)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()

    def deliver(self, handler: IdempotencyHandler, key: str) -> Any:
        def body() -> str:
            self.runs[key] += 1
            return f"{key}#{self.runs[key]}"

        return handler.execute(body, operation=OP, tenant=TENANT, key=key,
                               payload={"amount": 100})


def make_handler(store: SQLStore) -> IdempotencyHandler:
    return IdempotencyHandler(store, lease_timeout=30, ttl=3600, metrics=None,
                              outcome_retry_timeout=2.0)


def keys(n: int) -> list[str]:
    return [f"order-{i:03}" for i in range(n)]


def redeliver_on(cluster: Cluster, prefix: str, ledger: Ledger,
                 scopes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Every scope delivered again through a store on ``cluster``: the answers, and the
    keys whose body ran again (a run beyond the first)."""
    before = dict(ledger.runs)
    store = SQLStore(cluster.url, table_prefix=prefix)
    try:
        handler = make_handler(store)
        answers = {key: ledger.deliver(handler, key) for key in scopes}
    finally:
        store.close()
    rerun = [key for key in scopes if before.get(key, 0) and ledger.runs[key] > before[key]]
    return answers, rerun


def successes_on(cluster: Cluster, prefix: str, scopes: list[str]) -> list[str]:
    store = SQLStore(cluster.url, table_prefix=prefix)
    try:
        found = [(key, store.get(Scope(TENANT, OP, key))) for key in scopes]
    finally:
        store.close()
    return [key for key, record in found if record is not None
            and record.status == Status.SUCCESS]


# -- asynchronous replication: the loss -------------------------------------------------------
def test_async_replication_promotion_loses_recorded_outcomes_and_bodies_run_again() -> None:
    ledger, scopes, prefix = Ledger(), keys(DELIVERIES), unique_prefix("fo")
    replicated, stalled = scopes[:-STALLED], scopes[-STALLED:]
    with replicated_pair(synchronous=False) as pair:
        with connect(pair.primary, options="") as conn, pytest.raises(
            ConfigurationError, match="synchronous_standby_names is empty"
        ):
            check_synchronous_replication(conn)
        store = SQLStore(pair.primary.url, table_prefix=prefix)
        try:
            store.create_schema()
            handler = make_handler(store)
            acked = {key: ledger.deliver(handler, key) for key in replicated}
            pair.wait_caught_up()
            pair.stall()
            acked |= {key: ledger.deliver(handler, key) for key in stalled}
        finally:
            store.close()
        assert acked == {key: f"{key}#1" for key in scopes}, "every delivery was recorded"
        pair.fail_over()
        assert successes_on(pair.standby, prefix, scopes) == replicated
        answers, rerun = redeliver_on(pair.standby, prefix, ledger, scopes)
    # The loss: every outcome recorded while replication was cut is gone, its body ran again.
    assert rerun == stalled, f"re-runs after the promotion: {rerun}"
    assert {key: ledger.runs[key] for key in stalled} == dict.fromkeys(stalled, 2)
    assert answers == {key: f"{key}#{1 if key in replicated else 2}" for key in scopes}


# -- synchronous replication: no loss ---------------------------------------------------------
def test_sync_replication_promotion_keeps_every_recorded_outcome() -> None:
    ledger, scopes, prefix = Ledger(), keys(DELIVERIES), unique_prefix("fo")
    with replicated_pair(synchronous=True) as pair:
        with connect(pair.primary, options="") as conn:
            check_synchronous_replication(conn)  # passes: commits wait for the standby
        with connect(pair.standby) as conn, pytest.raises(ConfigurationError, match="recovery"):
            check_synchronous_replication(conn)
        store = SQLStore(pair.primary.url, table_prefix=prefix)
        try:
            store.create_schema()
            acked = {key: ledger.deliver(make_handler(store), key) for key in scopes}
        finally:
            store.close()
        pair.stall()  # at once: no wait for the standby to catch up
        blocked = attempt_while_stalled(pair.primary, prefix, ledger)
        pair.fail_over()
        assert successes_on(pair.standby, prefix, scopes) == scopes
        answers, rerun = redeliver_on(pair.standby, prefix, ledger, [*scopes, blocked])
    assert acked == {key: f"{key}#1" for key in scopes}
    assert rerun == [], f"bodies run again after the promotion: {rerun}"
    assert answers == {**acked, blocked: f"{blocked}#1"}
    assert ledger.runs == Counter(dict.fromkeys([*scopes, blocked], 1))


def attempt_while_stalled(primary: Cluster, prefix: str, ledger: Ledger) -> str:
    """A delivery while replication is cut is not acknowledged: its claim's commit waits in
    ``SyncRep`` until the store's deadline fails the call closed, before the body runs."""
    key = "order-blocked"
    store = SQLStore(primary.url, table_prefix=prefix, socket_timeout=BLOCKED_TIMEOUT,
                     connect_timeout=BLOCKED_TIMEOUT)
    try:
        with pytest.raises(IdempotencyError) as refused:
            ledger.deliver(make_handler(store), key)
    finally:
        store.close()
    assert refused.value.code == ErrorCode.STORE_UNAVAILABLE, refused.value
    assert ledger.runs[key] == 0
    wait_until(lambda: scalar(primary, "SELECT count(*) FROM pg_stat_activity "
                                       "WHERE wait_event = 'SyncRep'"),
               "the claim's commit waiting for the standby", 10)
    return key


# -- the check, against a private server configured each way ---------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[Cluster]:
    with standalone_server() as cluster:
        yield cluster


def set_standby_names(server: Cluster, value: str) -> None:
    """``ALTER SYSTEM`` + reload, then wait until new sessions see it."""
    with connect(server) as conn:
        conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}")
                     .format(sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
    wait_until(lambda: scalar(server, "SHOW synchronous_standby_names") == value,
               f"synchronous_standby_names = {value!r}", 10)


def session(server: Cluster, synchronous_commit: str | None = None) -> psycopg.Connection[Any]:
    """A connection whose session has ``synchronous_commit`` (the server's when ``None``)."""
    options = "" if synchronous_commit is None else f"-c synchronous_commit={synchronous_commit}"
    return connect(server, options=options)


def test_check_refuses_a_server_without_synchronous_standby_names(server: Cluster) -> None:
    set_standby_names(server, "")
    with session(server) as conn, pytest.raises(ConfigurationError) as error:
        check_synchronous_replication(conn)
    assert error.value.code == ErrorCode.CONFIGURATION_ERROR
    assert "synchronous_standby_names is empty" in error.value.message
    assert "set synchronous_standby_names on the primary" in error.value.message


@pytest.mark.parametrize("level", ["off", "local"])
def test_check_refuses_commits_that_do_not_wait_for_the_standby(server: Cluster,
                                                                level: str) -> None:
    set_standby_names(server, STANDBY_NAME)
    with session(server, level) as conn, pytest.raises(ConfigurationError) as error:
        check_synchronous_replication(conn)
    assert f"synchronous_commit is '{level}'" in error.value.message
    assert "set synchronous_commit = on" in error.value.message


@pytest.mark.parametrize("level", [None, "on", "remote_write", "remote_apply"])
@pytest.mark.parametrize("names", ["*", f"FIRST 1 ({STANDBY_NAME})", f"ANY 1 ({STANDBY_NAME})"])
def test_check_passes_when_commits_wait_for_a_standby(server: Cluster, names: str,
                                                      level: str | None) -> None:
    set_standby_names(server, names)
    with session(server, level) as conn:
        check_synchronous_replication(conn)
        check_synchronous_replication(conn.cursor())


def transaction_status(conn: psycopg.Connection[Any]) -> psycopg.pq.TransactionStatus:
    return conn.info.transaction_status


def test_check_leaves_a_connection_outside_autocommit_as_it_found_it(server: Cluster) -> None:
    set_standby_names(server, STANDBY_NAME)
    with psycopg.connect(server.dsn, autocommit=False) as conn:
        check_synchronous_replication(conn)
        assert transaction_status(conn) == psycopg.pq.TransactionStatus.IDLE
        conn.execute("SELECT 1")
        check_synchronous_replication(conn)  # inside the caller's transaction: left open
        assert transaction_status(conn) == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()


async def async_check(server: Cluster, driver: str, level: str) -> None:
    """The async check on a fresh ``driver`` connection whose session has ``level``."""
    conn: Any
    if driver == "psycopg":
        conn = await psycopg.AsyncConnection.connect(
            server.dsn, autocommit=True, options=f"-c synchronous_commit={level}")
    else:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.port, user="postgres",
                                     database="test",
                                     server_settings={"synchronous_commit": level})
    try:
        await acheck_synchronous_replication(conn)
    finally:
        await conn.close()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_async_check_on_each_driver(server: Cluster, driver: str) -> None:
    set_standby_names(server, STANDBY_NAME)
    asyncio.run(async_check(server, driver, "on"))
    with pytest.raises(ConfigurationError, match="synchronous_commit is 'local'"):
        asyncio.run(async_check(server, driver, "local"))
    set_standby_names(server, "")
    with pytest.raises(ConfigurationError, match="synchronous_standby_names is empty"):
        asyncio.run(async_check(server, driver, "on"))


def test_a_store_that_requires_synchronous_replication_refuses_a_server_without_it(
    server: Cluster, tmp_path: Path
) -> None:
    """``require_synchronous_replication=True``: the first use is a configuration error (the
    body does not run), on the sync store and on both async drivers; a store on another
    database refuses the option when it is built."""
    from idempotent_tasks import AsyncSQLStore, IdempotencyHandler

    set_standby_names(server, "")
    ran: list[str] = []
    store = SQLStore(server.url, table_prefix="t_syncrep", require_synchronous_replication=True)
    handler = IdempotencyHandler(store, metrics=None)
    outcome = handler.run(lambda: ran.append("sync"), operation="o", tenant="t", key="k")
    assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
    assert "synchronous_standby_names is empty" in (outcome.detail or "")
    store.close()

    async def first_use(url: str) -> Any:
        astore = AsyncSQLStore(url, table_prefix="t_syncrep",
                               require_synchronous_replication=True)
        try:
            return await IdempotencyHandler(astore, metrics=None).run_async(
                _async_body(ran), operation="o", tenant="t", key="k")
        finally:
            await astore.close()

    for url in (server.url, server.url.replace("+psycopg", "+asyncpg")):
        outcome = asyncio.run(first_use(url))
        assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
    assert ran == []
    with pytest.raises(ConfigurationError, match="needs PostgreSQL"):
        SQLStore(f"sqlite:///{tmp_path / 'x.db'}", require_synchronous_replication=True)


def _async_body(ran: list[str]) -> Any:
    async def body() -> None:
        ran.append("async")

    return body
