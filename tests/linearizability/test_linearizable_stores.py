"""Concurrent histories of every real store, with faults, are linearizable.

Per store: four worker processes (plus the replacements of killed ones) run random
operations of the store contract on four scopes of a tenant of this run — PostgreSQL with a
table prefix of its own, Redis with a key prefix of its own (both reached through a
loopback TCP proxy that can stall and drop the connections), SQLite on a file of its own —
while the runner SIGKILLs workers (inside an operation and at random) and drops the
connections.  The histories are then checked against the store contract's sequential
model (:mod:`.checker`); at least 1,000 operations per store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from idempotent_tasks import RedisStore, SQLStore
from idempotent_tasks.stores.base import Store
from tests._proxy import TCPProxy
from tests._services import POSTGRES_URL, REDIS_URL, require

from .checker import check
from .history import READS, Op
from .runner import FaultNotVerified, Run, Target, _wait, proxy_stall

pytestmark = pytest.mark.slow
OPS = 1500


def proxy_drop(proxy: TCPProxy) -> Callable[[], str]:
    def drop() -> str:
        open_before, accepted = proxy.open_connections, proxy.accepted
        if not open_before:
            raise FaultNotVerified("no connection to drop")
        proxy.drop()
        if proxy.open_connections:
            raise FaultNotVerified("connections survived the drop")
        proxy.forward()
        _wait(lambda: proxy.accepted > accepted, "the workers to reconnect")
        return f"dropped {open_before} connections; the workers reconnected"
    return drop


@contextlib.contextmanager
def sqlite_target(tmp_path: Path) -> Iterator[Target]:
    path = tmp_path / "lin.db"
    url = f"sqlite:///{path}"
    store = SQLStore(url)
    store.create_schema()
    store.close()

    @contextlib.contextmanager
    def stall() -> Iterator[None]:
        """The runner holds SQLite's write lock: every worker's next write waits for it."""
        lock = sqlite3.connect(path, timeout=10, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            lock.execute("ROLLBACK")
            lock.close()

    # a claim of a scope that has a record is one read, which WAL mode never blocks
    yield Target("sqlite", url, None, stall, unheld=frozenset({*READS, "create"}))


@contextlib.contextmanager
def network_target(kind: str) -> Iterator[Target]:
    require(kind)
    prefix = f"lin_{uuid.uuid4().hex[:10]}"
    store: Store
    if kind == "postgres":
        store = SQLStore(POSTGRES_URL, table_prefix=prefix)
        upstream = make_url(POSTGRES_URL).port or 5432
    else:
        store = RedisStore(REDIS_URL, prefix=prefix)
        upstream = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    store.create_schema()
    try:
        with TCPProxy(upstream) as proxy:
            if kind == "postgres":
                url = make_url(POSTGRES_URL).set(host="127.0.0.1", port=proxy.port)
                worker_url = url.render_as_string(hide_password=False)
            else:
                worker_url = f"redis://127.0.0.1:{proxy.port}/0"
            yield Target(kind, worker_url, prefix, lambda: proxy_stall(proxy),
                         proxy_drop(proxy))
    finally:
        drop = getattr(store, "drop_schema", None)
        if callable(drop):
            drop()
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
def test_concurrent_histories_with_faults_are_linearizable(
    kind: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    target = sqlite_target(tmp_path) if kind == "sqlite" else network_target(kind)
    with target as t:
        run = Run(t, tmp_path, ops=OPS, seed=sum(map(ord, kind)))
        ops = run.execute()
    verdict = check(ops)
    summary = (f"{kind}: {verdict.ops} operations ({verdict.indeterminate} indeterminate) "
               f"by {len({op.process for op in ops})} processes on {verdict.scopes} scopes; "
               f"{run.kills} SIGKILLs ({run.mid_op_kills} inside an operation); faults: "
               f"{run.faults}; {verdict.steps} search steps")
    record_property("linearizability", summary)
    print(summary)
    assert verdict.ops >= 1000
    assert run.kills == sum(f.startswith("SIGKILL") for f in run.faults) >= 2
    # each kill inside an operation left it without a completion (reads among them are
    # dropped before the check: an unknown read constrains nothing)
    assert sum(op.completed is None for op in ops) >= run.mid_op_kills >= 2
    if kind != "sqlite":
        assert sum(f.startswith("dropped") for f in run.faults) == 2
    assert verdict.ok, "\n".join(verdict.violations)
    assert not check(with_a_refused_write_made_visible(ops)).ok  # the check has teeth here


def with_a_refused_write_made_visible(ops: list[Op]) -> list[Op]:
    """The same history, but one read shows the response of a SUCCESS write the store
    refused.  Each response is unique to its write and a refused write changes nothing, so
    no order of these operations explains that read: the checker must refuse it."""
    refused = next(op for op in ops if op.name == "mark_success" and op.known
                   and op.result is False)
    read = next(op for op in ops if op.name == "get" and op.known and op.result
                and op.result[0] == "SUCCESS")
    forged = [*read.result[:2], refused.args["resp"], *read.result[3:]]
    return [dataclasses.replace(op, result=forged) if op is read else op for op in ops]
