"""SQLStore's change feed on PostgreSQL (``LISTEN``/``NOTIFY``): announcements wake the
waiters of their scope — in another thread or another process — and no other; one listener
connection per store, which survives the server killing it and stops with ``close()``;
stores that cannot listen (SQLite, MySQL, PgBouncer without ``listen_url``) have no feed.

Races are forced by waiting until the waiter is registered (the feed's registry), never by
sleeping; every wait that should be woken has a timeout far beyond its budget, so a True
can only come from the wake-up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from idempotent_tasks import ConfigurationError, SQLStore
from idempotent_tasks.stores import ChangeFeedStore, Scope
from idempotent_tasks.stores._feed import Waiters, scope_digest
from idempotent_tasks.stores.sql.protocol import channel_name, listener_name

from .._services import PGBOUNCER_URL, POSTGRES_URL, require
from .._wait import budget, wait_until
from ..conftest import unique_prefix

A = Scope("acme", "payments.charge", "order-1")
B = Scope("acme", "payments.charge", "order-2")
LONG = 600.0  # a wait that must be woken: its timeout never decides a test
pytestmark = pytest.mark.postgres


def _libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _admin(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _listener_pids(store: SQLStore) -> list[int]:
    name = listener_name(channel_name(store.table_prefix))
    rows = _admin("SELECT pid FROM pg_stat_activity WHERE application_name = %s", name)
    return [int(pid) for (pid,) in rows]


@pytest.fixture
def store() -> Iterator[SQLStore]:
    require("postgres")
    made = SQLStore(POSTGRES_URL, table_prefix=unique_prefix("feed"))
    made.create_schema()
    try:
        yield made
    finally:
        made.close()
        made.drop_schema()
        made.close()


class Waiter:
    """``wait_for_change`` in a thread of its own, its answer kept."""

    def __init__(self, store: Any, scope: Scope, timeout: float = LONG) -> None:
        self.store, self.scope = store, scope
        self.answer: bool | None = None
        self.thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self.thread.start()

    def _run(self, timeout: float) -> None:
        self.answer = self.store.wait_for_change(self.scope, timeout=timeout)

    def registered(self) -> None:
        """Until this waiter's event is in the registry and the listener listens."""
        feed = self.store._feed
        wait_until(lambda: feed.listening and scope_digest(self.scope) in feed.waiters._events,
                   "the waiter to be registered", 10)

    def result(self) -> bool | None:
        self.thread.join(budget(10))
        assert not self.thread.is_alive(), "the waiter was not woken"
        return self.answer


def _wakes(store: Any, scope: Scope) -> None:
    """A waiter of ``scope`` in another thread is woken by the store's announcement."""
    waiter = Waiter(store, scope)
    waiter.registered()
    store.announce_change(scope)
    assert waiter.result() is True


def test_a_postgres_store_is_a_change_feed_store(store: SQLStore) -> None:
    assert isinstance(store, ChangeFeedStore)


def test_an_announcement_wakes_a_waiter_in_another_thread(store: SQLStore) -> None:
    _wakes(store, A)


def test_an_announcement_from_another_process_wakes_the_waiter(store: SQLStore) -> None:
    waiter = Waiter(store, A)
    waiter.registered()
    code = (
        "import sys\nfrom idempotent_tasks import SQLStore\nfrom idempotent_tasks.stores "
        "import Scope\ns = SQLStore(sys.argv[1], table_prefix=sys.argv[2])\n"
        "s.announce_change(Scope(*sys.argv[3:6]))\ns.close()\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, POSTGRES_URL, store.table_prefix, *A],
                   check=True, env=env, timeout=budget(60))
    assert waiter.result() is True


def test_a_wait_without_an_announcement_times_out_false(store: SQLStore) -> None:
    assert store.wait_for_change(A, timeout=0.2) is False
    assert store._feed is not None and store._feed.listening  # the first wait listened


def test_an_announcement_wakes_only_its_own_scope(store: SQLStore) -> None:
    a, b = Waiter(store, A), Waiter(store, B)
    a.registered()
    b.registered()
    store.announce_change(B)
    assert b.result() is True  # B's notification has been dispatched
    assert store._feed is not None
    events = store._feed.waiters._events[scope_digest(A)]
    assert events and not any(event.is_set() for event in events)  # A still waits, unwoken
    store.announce_change(A)
    assert a.result() is True


def test_many_waiters_share_one_listener_connection(store: SQLStore) -> None:
    scopes = [Scope("acme", "op", f"k-{i}") for i in range(12)]
    waiters = [Waiter(store, scope) for scope in scopes]
    for waiter in waiters:
        waiter.registered()
    assert len(_listener_pids(store)) == 1
    for scope in scopes:
        store.announce_change(scope)
    assert [waiter.result() for waiter in waiters] == [True] * len(scopes)


def test_the_listener_reconnects_after_its_backend_is_terminated(store: SQLStore) -> None:
    stranded = Waiter(store, A)  # waiting across the loss: woken when listening again
    stranded.registered()
    (pid,) = _listener_pids(store)
    _admin("SELECT pg_terminate_backend(%s)", pid)
    assert stranded.result() is True
    wait_until(lambda: _listener_pids(store) not in ([], [pid]), "a new listener", 10)
    _wakes(store, B)
    assert len(_listener_pids(store)) == 1


def test_close_joins_the_listener_and_a_later_wait_listens_again(store: SQLStore) -> None:
    assert store.wait_for_change(A, timeout=0.05) is False
    assert store._feed is not None and store._feed._listener is not None
    thread = store._feed._listener.thread
    wait_until(lambda: _listener_pids(store), "the listener's backend", 10)
    store.close()
    assert not thread.is_alive()
    wait_until(lambda: not _listener_pids(store), "the listener's backend to end", 10)
    _wakes(store, A)


def test_the_channel_and_payload_carry_no_key() -> None:
    secret = Scope("tenant-x", "op", "card-4242-4242")
    payload = scope_digest(secret)
    assert len(payload) == 32 and int(payload, 16) >= 0
    assert payload != scope_digest(Scope("tenant-x", "op", "card-4242-4243"))
    assert len(channel_name("p" * 40)) <= 63  # a valid identifier for the longest prefix


def test_stores_that_cannot_listen_have_no_feed(tmp_path: Path) -> None:
    sqlite = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}")
    mysql = SQLStore("mysql+pymysql://root@127.0.0.1:3306/test")  # never connects
    for polling in (sqlite, mysql):
        assert not isinstance(polling, ChangeFeedStore)
        assert not hasattr(polling, "announce_change")
        assert not hasattr(polling, "wait_for_change")
        polling.close()
    with pytest.raises(ConfigurationError, match="listen_url needs PostgreSQL"):
        SQLStore(f"sqlite:///{tmp_path / 'idem.db'}", listen_url=POSTGRES_URL)
    with pytest.raises(ConfigurationError, match="listen_url must be a PostgreSQL URL"):
        SQLStore(POSTGRES_URL, listen_url="mysql://root@127.0.0.1/test")


def test_behind_pgbouncer_the_feed_needs_listen_url() -> None:
    require("pgbouncer")
    prefix = unique_prefix("feedpgb")
    polling = SQLStore(PGBOUNCER_URL, prepare=False, table_prefix=prefix)
    assert not isinstance(polling, ChangeFeedStore)
    listening = SQLStore(PGBOUNCER_URL, prepare=False, table_prefix=prefix,
                         listen_url=POSTGRES_URL)
    listening.create_schema()
    try:
        assert isinstance(listening, ChangeFeedStore)
        _wakes(listening, A)  # pg_notify through PgBouncer
    finally:
        listening.close()
        listening.drop_schema()
        listening.close()
        polling.close()


def test_wake_all_wakes_every_registered_waiter_once() -> None:
    """What a listener back from a lost connection does: every waiter looks again."""
    waiters = Waiters()
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda s=s: answers.append(
        waiters.wait(scope_digest(s), LONG))) for s in (A, A, B)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(waiters) == 3, "three registered waiters", 10)
    waiters.wake_all()
    for thread in threads:
        thread.join(budget(10))
    assert answers == [True, True, True] and len(waiters) == 0
    assert waiters.wait(scope_digest(A), 0.01) is False  # nothing left set
