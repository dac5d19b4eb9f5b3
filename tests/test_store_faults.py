"""Store faults against real servers: slow links, dropped connections, an exhausted pool, a
PostgreSQL restart and a Redis server killed with SIGKILL.

What must hold (docs/design.md, "The algorithm", step 7): a store that cannot be reached before the body runs gives
``STORE_UNAVAILABLE`` and the body does not run (fail closed), within the store's timeouts —
never a hang; once the store is back, the very next calls work with no manual step; a
connection lost while the body ran is retried (bounded) for the outcome write.

Slow and dropped links go through :class:`tests._proxy.TCPProxy`.  The PostgreSQL restart
runs against the session's private cluster (``tests/_private_postgres.py``; the machine's
PostgreSQL is never restarted), and each half of it is verified: the postmaster is gone and a
connection is refused, then a new postmaster (a new pid) serves.  Redis restarts use a private
``redis-server`` on a free port (the shared 6379 is never touched).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FaultyStore
from tests._wait import wait_until as _wait_until

from ._private_postgres import PrivatePostgres, refused
from ._proxy import TCPProxy
from ._services import POSTGRES_URL, REDIS_URL, reachable, require
from .conftest import drop_store, unique_prefix

OP, TENANT = "payments.charge", "acme"
TIMEOUT = 1.0  # the stores' connect/socket timeouts in this file
#: Upper bound for a fail-closed answer: the timeout plus generous slack for a loaded CI box.
FAIL_FAST = TIMEOUT + 4.0
SERVER_WAIT = 30.0


class Body:
    """A body that counts its runs."""

    def __init__(self, result: Any = "ok") -> None:
        self.runs = 0
        self.result = result

    def __call__(self) -> Any:
        self.runs += 1
        return self.result


def run(h: IdempotencyHandler, fn: Callable[[], Any], key: str) -> Any:
    return h.execute(fn, operation=OP, tenant=TENANT, key=key, payload={"amount": 100})


def assert_fails_closed(h: IdempotencyHandler, key: str) -> None:
    body = Body()
    started = time.monotonic()
    with pytest.raises(IdempotencyError) as ei:
        run(h, body, key)
    elapsed = time.monotonic() - started
    assert ei.value.code == ErrorCode.STORE_UNAVAILABLE, ei.value
    assert body.runs == 0, "the body ran although the store was unreachable"
    assert elapsed < FAIL_FAST, f"failing closed took {elapsed:.1f}s"


def make_handler(store: Any, **kw: Any) -> IdempotencyHandler:
    kw.setdefault("outcome_retry_timeout", 10.0)
    return IdempotencyHandler(store, lease_timeout=30, ttl=3600, metrics=None, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], what: str, timeout: float = SERVER_WAIT) -> None:
    """Poll with a deadline (for servers coming back), never a blind sleep."""
    _wait_until(condition, what, timeout, poll=0.05)


def postgres_url(port: int | None = None) -> str:
    url = sa.make_url(POSTGRES_URL)
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    return url.render_as_string(hide_password=False)


def redis_url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/{REDIS_URL.rsplit('/', 1)[-1] or 0}"


def build_store(kind: str, port: int | None = None, **kw: Any) -> Store:
    if kind == "postgres":
        from idempotent_tasks import SQLStore

        kw.setdefault("socket_timeout", TIMEOUT)
        pg = SQLStore(
            postgres_url(port), table_prefix=unique_prefix("ft"), connect_timeout=TIMEOUT, **kw
        )
        pg.create_schema()
        return pg
    from idempotent_tasks import RedisStore

    assert port is not None
    rs = RedisStore(
        redis_url(port), prefix=unique_prefix("ft"), connect_timeout=TIMEOUT,
        socket_timeout=TIMEOUT, **kw,
    )
    rs.create_schema()
    return rs


# -- through the proxy ----------------------------------------------------------------------------
@pytest.fixture(params=["postgres", "redis"])
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[TCPProxy, Store]]:
    kind: str = request.param
    require(kind)
    url = sa.make_url(POSTGRES_URL if kind == "postgres" else REDIS_URL)
    target = url.port or (5432 if kind == "postgres" else 6379)
    proxy = TCPProxy(target).start()
    store = build_store(kind, proxy.port)
    try:
        yield proxy, store
    finally:
        proxy.set_latency(0.0)
        proxy.forward()
        drop_store(store)
        proxy.stop()


def test_slow_store_still_gives_correct_results(proxied: tuple[TCPProxy, Store]) -> None:
    proxy, store = proxied
    h = make_handler(store)
    run(h, Body(), "warm-up")
    proxy.set_latency(0.02)
    started = time.monotonic()
    assert store.get_retry_count(Scope(TENANT, OP, "warm-up")) == 0  # one round trip
    assert time.monotonic() - started >= 0.04, "the proxy added no latency: test is vacuous"

    # concurrent duplicates over a slow link: exactly one runs, the others wait or replay
    n = 4
    body = Body({"charged": 100})
    barrier = threading.Barrier(n, timeout=10)
    answers: list[Any] = []
    lock = threading.Lock()

    def deliver() -> None:
        barrier.wait()
        try:
            answer: Any = run(h, body, "slow-1")
        except IdempotencyError as exc:
            answer = exc.code
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=deliver) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert body.runs == 1
    assert len(answers) == n
    assert set(map(str, answers)) <= {str({"charged": 100}), ErrorCode.REQUEST_IN_PROGRESS}
    assert run(h, body, "slow-1") == {"charged": 100} and body.runs == 1

    # a transient failure over the slow link is counted, released, and re-run
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionResetError("downstream hiccup")
        return "second time lucky"

    with pytest.raises(ConnectionResetError):
        run(h, flaky, "slow-2")
    assert run(h, flaky, "slow-2") == "second time lucky"
    rec = h.get_record(operation=OP, tenant=TENANT, key="slow-2")
    assert rec is not None and rec.status is Status.SUCCESS and rec.retry_count == 1


def test_dropped_connections_fail_closed_and_recover(proxied: tuple[TCPProxy, Store]) -> None:
    proxy, store = proxied
    h = make_handler(store)
    first = Body("first")
    assert run(h, first, "before-drop") == "first"  # a pooled connection is open now
    assert proxy.open_connections >= 1

    proxy.drop()  # every connection dies; new ones are refused
    assert_fails_closed(h, "during-drop")  # on the dead pooled connection
    assert_fails_closed(h, "during-drop")  # on a refused new connection
    with pytest.raises(IdempotencyError) as ei:
        h.get_record(operation=OP, tenant=TENANT, key="before-drop")
    assert ei.value.code == ErrorCode.STORE_UNAVAILABLE

    proxy.forward()  # back: no manual step, the very next calls work
    body = Body("after")
    assert run(h, body, "during-drop") == "after" and body.runs == 1
    assert run(h, first, "before-drop") == "first" and first.runs == 1  # replayed


def test_connection_dropped_while_the_body_runs_outcome_is_retried(
    proxied: tuple[TCPProxy, Store],
) -> None:
    """The body runs, the link dies before ``mark_success``: the write is retried with
    backoff (docs/design.md, step 7) and lands once the link is back — no OUTCOME_NOT_RECORDED, no re-run."""
    proxy, store = proxied
    faulty = FaultyStore(store)
    attempts: list[int] = []

    def before_mark_success() -> None:
        attempts.append(1)
        if len(attempts) == 2:
            proxy.forward()  # the first attempt failed on the dead link; the second succeeds

    faulty.before["mark_success"] = before_mark_success
    h = make_handler(faulty)
    run(h, Body(), "warm-up")
    attempts.clear()

    body_runs: list[int] = []

    def body() -> str:
        body_runs.append(1)
        proxy.drop()
        return "done"

    assert run(h, body, "mid-body") == "done"
    assert body_runs == [1]
    assert len(attempts) == 2, attempts
    rec = h.get_record(operation=OP, tenant=TENANT, key="mid-body")
    assert rec is not None and rec.status is Status.SUCCESS and rec.response == "done"


def test_store_that_stops_answering_fails_closed_not_hangs(
    proxied: tuple[TCPProxy, Store],
) -> None:
    """A link that goes silent (a partition: connections stay open, nothing comes back) is
    a store that cannot be reached: STORE_UNAVAILABLE within the store's timeout."""
    proxy, store = proxied
    h = make_handler(store)
    run(h, Body(), "warm-up")  # an established, pooled connection
    proxy.set_latency(3600.0)
    outcome: list[Any] = []
    done = threading.Event()
    body = Body()

    def deliver() -> None:
        started = time.monotonic()
        try:
            outcome.append(run(h, body, "silent"))
        except IdempotencyError as exc:
            outcome.append(exc.code)
        outcome.append(time.monotonic() - started)
        done.set()

    thread = threading.Thread(target=deliver, daemon=True)
    thread.start()
    try:
        finished = done.wait(FAIL_FAST)
    finally:
        proxy.drop()  # frees a hung call either way
        thread.join(10)
    assert finished, f"a call on a silent {store.name} link hung for more than {FAIL_FAST}s"
    assert outcome[0] == ErrorCode.STORE_UNAVAILABLE and body.runs == 0


# -- pool exhaustion -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_exhausted_pool_fails_closed_within_the_timeout(kind: str, tmp_path: Path) -> None:
    from idempotent_tasks import SQLStore

    if kind == "postgres":
        require("postgres")
        store = SQLStore(
            POSTGRES_URL, table_prefix=unique_prefix("ft"), connect_timeout=TIMEOUT, pool_size=1
        )
    else:
        store = SQLStore(f"sqlite:///{tmp_path / 'pool.db'}", connect_timeout=TIMEOUT, pool_size=1)
    store.create_schema()
    h = make_handler(store)
    held = threading.Event()
    release = threading.Event()
    pool = store.engine.pool
    capacity = pool.size() + getattr(pool, "_max_overflow", 0)  # pool_size + overflow

    def hold_every_connection() -> None:
        with contextlib.ExitStack() as stack:
            for _ in range(capacity):
                stack.enter_context(store.engine.connect())
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_every_connection, daemon=True)
    holder.start()
    try:
        assert held.wait(10), "could not take every pooled connection"
        assert_fails_closed(h, "no-connection")
    finally:
        release.set()
        holder.join(10)
    try:
        body = Body("served")
        assert run(h, body, "no-connection") == "served" and body.runs == 1
    finally:
        drop_store(store)


# -- PostgreSQL restarted ------------------------------------------------------------------------
def test_postgres_restart_mid_run_fails_closed_then_recovers(
    private_postgres: PrivatePostgres,
) -> None:
    pg = private_postgres
    store = build_store("postgres", pg.port)
    h = make_handler(store)
    first = Body("first")
    assert run(h, first, "before-restart") == "first"  # pooled connection to the old server
    old_pid = pg.postmaster_pid()
    try:
        pg.stop()  # the restart, first half: the server is gone
        assert pg.postmaster_pid() is None and refused(pg.port), "PostgreSQL did not stop"
        assert_fails_closed(h, "during-restart")  # the dead pooled connection
        assert_fails_closed(h, "during-restart")  # connection refused
    finally:
        pg.ensure_running()  # always leave it running
    assert pg.postmaster_pid() not in (None, old_pid), "no new postmaster"
    try:
        body = Body("after")
        assert run(h, body, "during-restart") == "after" and body.runs == 1  # the very next call
        assert run(h, first, "before-restart") == "first" and first.runs == 1  # durable: replayed
    finally:
        drop_store(store)


# -- a private Redis killed with SIGKILL ----------------------------------------------------------
class RedisServer:
    """``redis-server`` on a free port, without persistence, that the test may kill."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: reachable(self.port, timeout=0.2), f"redis-server on {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL
            self.proc.wait(10)


def test_redis_killed_mid_run_fails_closed_then_recovers(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        store = build_store("redis", server.port)
        h = make_handler(store)
        assert run(h, Body("first"), "before-kill") == "first"
        server.kill()
        assert_fails_closed(h, "during-kill")  # the dead pooled connection
        assert_fails_closed(h, "during-kill")  # connection refused
        server.start()  # same port, empty (no persistence), no scripts loaded
        body = Body("after")
        assert run(h, body, "during-kill") == "after" and body.runs == 1
        assert run(h, Body("again"), "during-kill") == "after"  # replayed from the new server
        store.close()
    finally:
        server.kill()


def _sql_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'idem.db'}"
    if kind == "mysql":
        from tests.stores._backends import mysql_url

        return mysql_url()
    require("postgres")
    return POSTGRES_URL


def _drop_counters(url: str, prefix: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {prefix}_retry_counters"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "mysql"])
def test_a_partly_missing_schema_is_refused_on_first_use(kind: str, tmp_path: Path) -> None:
    """The schema is checked whole on a store's first use: with the retry counters' table
    dropped, the first call is CONFIGURATION_ERROR naming it, before any claim is taken and
    any body runs — not a failure after the body, when its outcome cannot be recorded."""
    from idempotent_tasks import SQLStore

    url, prefix = _sql_url(kind, tmp_path), unique_prefix()
    SQLStore(url, table_prefix=prefix).create_schema()
    _drop_counters(url, prefix)
    store = SQLStore(url, table_prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None)
    body = Body()
    try:
        scope = {"operation": "faults.op", "tenant": "acme", "key": "k-1"}
        outcome = handler.run(body, **scope)
        assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
        assert f"{prefix}_retry_counters" in (outcome.detail or "")
        assert body.runs == 0
        store.create_schema()  # the fix the message names
        assert handler.run(body, **scope).kind == "executed"
    finally:
        handler.close()
        with contextlib.suppress(Exception):
            store.drop_schema()
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_failure_that_cannot_be_recorded_releases_its_claim(kind: str, tmp_path: Path) -> None:
    """The retry counters' table was dropped while the store was in use (after its first-use
    check): the failing body's outcome cannot be written (CONFIGURATION_ERROR, the driver's
    reason in it), and its claim is released instead of staying PROCESSING for a whole
    lease, so the next delivery runs instead of being refused as in progress."""
    from idempotent_tasks import SQLStore

    prefix = unique_prefix()
    url = _sql_url(kind, tmp_path)
    store = SQLStore(url, table_prefix=prefix)
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=None, outcome_retry_timeout=0.5)
    try:
        assert store.get(Scope("acme", "faults.op", "warm-up")) is None  # the check passed
        _drop_counters(url, prefix)

        def flaky() -> None:
            raise RuntimeError("transient")

        scope = {"operation": "faults.op", "tenant": "acme", "key": "k-1"}
        first = handler.run(flaky, **scope)
        assert (first.kind, first.error_code) == ("poisoned", ErrorCode.CONFIGURATION_ERROR)
        assert "retry_counters" in (first.detail or "")
        assert store.get(Scope("acme", "faults.op", "k-1")) is None  # released
        again = handler.run(lambda: "ran", **scope)
        assert again.kind != "in_progress"
    finally:
        handler.close()
        with contextlib.suppress(Exception):
            store.drop_schema()
        store.close()
