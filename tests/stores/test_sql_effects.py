"""``save_steps`` on PostgreSQL and MySQL holds the record row while it writes: a takeover
that commits first makes it write nothing.

The takeover is forced open, not hoped for: a second connection changes the record's token
in a transaction it keeps open; ``save_steps`` with the old token is seen waiting for that
row's lock (the server's own lock views), then the takeover commits.  Without the lock,
``save_steps`` would read its snapshot (the old token) and write the steps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import SQLStore
from idempotent_tasks._core.records import Scope

from .._wait import budget, wait_until
from ..conftest import drop_store, make_store

S = Scope("acme", "payments.charge", "k-1")
NOW = 1_700_000_000.0
#: The server's view of a statement on ``{table}`` waiting for a row lock.
WAITING = {
    "postgres": "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND strpos(query, '{table}') > 0",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' "
             "AND LOCATE('{table}', trx_query) > 0",
}

#: How often to look.  InnoDB fills ``information_schema.innodb_trx`` from a cache it
#: refreshes only when the view has not been read for 100 ms: polled faster, a watcher that
#: looked once before ``save_steps`` began waiting keeps reading that first, empty picture
#: (seen on a loaded machine: the wait showed only when a poll happened to come late).
POLL = {"postgres": 0.02, "mysql": 0.25}


def waiting(watcher: Any, kind: str, table: str) -> int:
    """How many statements on ``table`` wait for a lock (a fresh transaction each time: the
    statistics views keep one snapshot per transaction)."""
    count = int(watcher.exec_driver_sql(WAITING[kind].format(table=table)).scalar())
    watcher.rollback()
    return count


@pytest.fixture(params=["postgres", "mysql"])
def kind_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    store = make_store(request.param, tmp_path)
    try:
        yield request.param, store
    finally:
        drop_store(store)


def test_a_takeover_that_commits_first_makes_save_steps_write_nothing(
    kind_store: tuple[str, SQLStore],
) -> None:
    kind, store = kind_store
    claimed = store.create(S, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    token = claimed.record.fencing_token
    records = store.engine.dialect.identifier_preparer.quote(f"{store.table_prefix}_records")
    key = "`key`" if kind == "mysql" else "key"
    results: list[bool] = []
    with store.engine.connect() as takeover, store.engine.connect() as watcher:
        takeover.exec_driver_sql(
            f"UPDATE {records} SET fencing_token = fencing_token + 1000 "
            f"WHERE tenant = 'acme' AND operation = 'payments.charge' AND {key} = 'k-1'"
        )  # uncommitted: the row is locked by the "takeover"
        saver = threading.Thread(target=lambda: results.append(
            store.save_steps(S, token=token, steps=b"stale", now=NOW + 1)
        ))
        saver.start()
        counters = f"{store.table_prefix}_retry_counters"
        wait_until(lambda: waiting(watcher, kind, counters),
                   "save_steps waiting for the record row", 30, poll=POLL[kind])
        takeover.commit()
        saver.join(budget(30))
    assert results == [False]
    assert store.load_steps(S) is None and store.get_retry_count(S) == 0
