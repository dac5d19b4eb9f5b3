"""The ledger chaos run (``_harness.py``) with the store on MariaDB: ``SQLStore("mysql+pymysql://
…")``, Dramatiq workers on RabbitMQ, both ledger profiles — ``transactional`` (the ledger row
and the SUCCESS commit in one InnoDB transaction: exactly one row per operation) and
``plain``.  The faults are the harness's: worker SIGKILLs and freezes past the lease, a broker
connection fault, a Redis cache outage, and a restart of the database — a private MariaDB
server this module starts (``mariadbd`` on a free port, its own data directory), so the
machine's server is never touched.

This module is also the workers' Dramatiq app (``dramatiq tests.chaos.test_mariadb_chaos``
with ``CHAOS_MARIADB_WORKER=1``): the ledger bodies here write MariaDB, the shared
``_body.LedgerWriter`` writes PostgreSQL.  ``CHAOS_PROFILE=long`` makes the run larger.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, SQLStore
from tests._services import IN_CI, reachable

from ._body import CONFIG_ENV, OPERATIONS, WorkerConfig, make_handler
from ._faults import PrivateRedis, RabbitVhost, free_port, wait_until
from ._harness import ChaosEnv, make_keys, run_chaos
from ._integrations import DramatiqIntegration, new_run_id
from ._ledger import must_answer
from ._profile import PROFILE_ENV, Profile

WORKER_ENV = "CHAOS_MARIADB_WORKER"
ROOT = Path(__file__).resolve().parents[2]
LEASE, HEARTBEAT, MAX_RETRIES = 3.0, 1.0, 50
PROFILES = {
    "ci": Profile(name="mariadb-ci", operations=150, duplicate_fraction=0.3, workers=2, kills=3,
                  stops=1, broker_faults=1, pg_restarts=1, redis_stops=1, crash_keys=2,
                  publish_seconds=15.0, timeout=240.0),
    "long": Profile(name="mariadb-long", operations=3000, duplicate_fraction=0.3, workers=3,
                    kills=20, stops=4, broker_faults=3, pg_restarts=2, redis_stops=2,
                    crash_keys=8, publish_seconds=180.0, timeout=1800.0),
}
PROFILE = PROFILES["long" if os.environ.get(PROFILE_ENV) == "long" else "ci"]


# -- a private MariaDB server ---------------------------------------------------------------------
class PrivateMariaDB:
    """``mariadbd`` with its own data directory on a free port; restartable."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"mysql+pymysql://root@127.0.0.1:{self.port}/chaos"
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={root / 'data'}",
             "--auth-root-authentication-method=normal", "--skip-test-db", "--user=root"],
            check=True, capture_output=True, timeout=120,
        )

    def start(self) -> None:
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(
            ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={self.root / 'data'}",
             f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.root / 'sock'}",
             f"--pid-file={self.root / 'pid'}", "--user=root", "--skip-grant-tables",
             "--skip-log-bin", "--innodb-buffer-pool-size=64M", "--max-connections=300"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: reachable(self.port), 30, f"MariaDB on port {self.port}")
        wait_until(self._answers, 30, "MariaDB to answer queries")

    def _answers(self) -> bool:
        try:
            conn = _connect(self.port, None)
        except Exception:
            return False
        with contextlib.closing(conn):
            conn.cursor().execute("CREATE DATABASE IF NOT EXISTS chaos")
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.proc = None

    def restart(self) -> str:
        """Stop (clean shutdown), verify the port refuses connections, start again."""
        pid = self.proc.pid if self.proc else None
        self.stop()
        assert not reachable(self.port), "MariaDB still accepts connections after stopping"
        self.start()
        return f"mariadbd pid {pid} stopped, port {self.port} refused, restarted"

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()


def _connect(port: int, database: str | None) -> Any:
    import pymysql

    return pymysql.connect(host="127.0.0.1", port=port, user="root", database=database,
                           autocommit=True, connect_timeout=2)


# -- the ledger (harness side) ----------------------------------------------------------------
class MariaDBLedger:
    """The ledger and the store's tables as the harness reads them (``_ledger.Ledger`` for
    MariaDB): queries answer None while the server restarts."""

    def __init__(self, run_id: str, prefix: str, port: int) -> None:
        self.table = f"chaos_{run_id}_ledger"
        self.crash_table = f"chaos_{run_id}_crashes"
        self.records, self.counters = f"{prefix}_records", f"{prefix}_retry_counters"
        self.port = port
        self._conn: Any = None
        self._lock = threading.Lock()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = _connect(self.port, "chaos")
                cur = self._conn.cursor()
                cur.execute(sql, params)
                return list(cur.fetchall())
            except Exception:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
                return None

    def must(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return must_answer(self.query, sql, params, "MariaDB")

    def create(self) -> None:
        self.must(f"CREATE TABLE {self.table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
                  "profile VARCHAR(16) NOT NULL, `key` VARCHAR(64) NOT NULL, "
                  "token VARCHAR(64) NOT NULL, pid INT NOT NULL) ENGINE=InnoDB")
        self.must(f"CREATE TABLE {self.crash_table} (`key` VARCHAR(64) PRIMARY KEY, pid INT) "
                  "ENGINE=InnoDB")

    def drop(self) -> None:
        self.query(f"DROP TABLE IF EXISTS {self.table}, {self.crash_table}")

    def count(self) -> int | None:
        rows = self.query(f"SELECT count(*) FROM {self.table}")
        return None if rows is None else int(rows[0][0])

    def rows(self) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for profile, key, token in self.must(
                f"SELECT profile, `key`, token FROM {self.table} ORDER BY id"):
            out[profile][key].append(token)
        return out

    def crashed_keys(self) -> set[str]:
        return {row[0] for row in self.must(f"SELECT `key` FROM {self.crash_table}")}

    def counters_now(self) -> dict[tuple[str, str], int] | None:
        rows = self.query(f"SELECT operation, `key`, count FROM {self.counters}")
        return None if rows is None else {(op.decode(), k.decode()): int(n) for op, k, n in rows}

    def status_counts(self) -> dict[tuple[str, str], int]:
        rows = self.must(f"SELECT operation, status, count(*) FROM {self.records} "
                         "GROUP BY operation, status")
        return {(op.decode(), status): int(n) for op, status, n in rows}

    def live_leases(self, now: float) -> int:
        rows = self.must(f"SELECT count(*) FROM {self.records} WHERE status = 'PROCESSING' "
                         "AND lease_expires_at > %s", (now,))
        return int(rows[0][0])


# -- the workers' bodies ----------------------------------------------------------------------
class MariaDBLedgerWriter:
    """``_body.LedgerWriter`` on MariaDB: one INSERT per execution; crash keys die once right
    after their effect (a committed marker row decides)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        import sqlalchemy as sa

        self.cfg = cfg
        self.crash_keys = frozenset(cfg.crash_keys)
        self.port = int(cfg.dsn)
        self._local = threading.local()
        self._insert = f"INSERT INTO {cfg.ledger} (profile, `key`, token, pid) VALUES (%s, %s, %s, %s)"
        self._insert_tx = sa.text(f"INSERT INTO {cfg.ledger} (profile, `key`, token, pid) "
                                  "VALUES (:profile, :key, :token, :pid)")
        self._mark = f"INSERT IGNORE INTO {cfg.crash_table} (`key`, pid) VALUES (%s, %s)"

    def plain(self, key: str) -> dict[str, str]:
        token = uuid.uuid4().hex
        self._execute(self._insert, ("plain", key, token, os.getpid()))
        self._maybe_crash(key)
        return {"key": key, "token": token}

    def transactional(self, conn: Any, key: str) -> dict[str, str]:
        token = uuid.uuid4().hex
        conn.execute(self._insert_tx, {"profile": "transactional", "key": key, "token": token,
                                       "pid": os.getpid()})
        self._maybe_crash(key)
        return {"key": key, "token": token}

    def _maybe_crash(self, key: str) -> None:
        if key in self.crash_keys and self._execute(self._mark, (key, os.getpid())) == 1:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the whole worker, after the effect

    def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        conn = getattr(self._local, "conn", None)
        try:
            if conn is None:
                conn = self._local.conn = _connect(self.port, "chaos")
            return int(conn.cursor().execute(sql, params))
        except Exception:
            self._local.conn = None  # reconnect next time (MariaDB restarted)
            with contextlib.suppress(Exception):
                conn.close()
            raise


def _worker_app() -> None:
    """The Dramatiq app of a worker process (``tests.chaos.dramatiq_app`` on MariaDB)."""
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    from idempotent_tasks.dramatiq import (
        IdempotencyMiddleware,
        current_connection,
        idempotent_actor,
    )

    cfg = WorkerConfig.from_env()
    broker = RabbitmqBroker(url=cfg.broker_url)
    broker.add_middleware(IdempotencyMiddleware(make_handler(cfg), recover_every=2.0,
                                                cleanup_every=600.0))
    broker.add_middleware(Results(backend=RedisBackend(url=cfg.result_url,
                                                       namespace=cfg.result_namespace)))
    dramatiq.set_broker(broker)
    ledger = MariaDBLedgerWriter(cfg)
    fast: dict[str, Any] = {"queue_name": cfg.queue, "min_backoff": 200, "max_backoff": 1000,
                            "store_results": True}

    @idempotent_actor(actor_name="chaos_tx", operation=OPERATIONS["transactional"],
                      transactional=True, **fast)
    def chaos_tx(key: str) -> dict[str, str]:
        return ledger.transactional(current_connection(), key)

    @idempotent_actor(actor_name="chaos_plain", operation=OPERATIONS["plain"], **fast)
    def chaos_plain(key: str) -> dict[str, str]:
        return ledger.plain(key)


if os.environ.get(WORKER_ENV) == "1" and os.environ.get(CONFIG_ENV):
    _worker_app()


# -- the test ---------------------------------------------------------------------------------
class MariaDBDramatiq(DramatiqIntegration):
    name = "dramatiq+mariadb"

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "dramatiq", "tests.chaos.test_mariadb_chaos",
                "--processes", "1", "--threads", "4"]


@pytest.fixture(scope="module")
def private_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    if shutil.which("mariadb-install-db") is None or not Path("/usr/sbin/mariadbd").exists():
        message = "MariaDB server binaries are not installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    server = PrivateMariaDB(tmp_path_factory.mktemp("mariadb"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mariadb_env(tmp_path: Path, private_mariadb: PrivateMariaDB,
                monkeypatch: pytest.MonkeyPatch, chaos_seed: int) -> Iterator[ChaosEnv]:
    import random

    monkeypatch.setenv(WORKER_ENV, "1")
    private_mariadb.ensure_running()
    rng, run_id = random.Random(chaos_seed), new_run_id()
    prefix = f"chaos_{run_id}"
    store = SQLStore(private_mariadb.url, table_prefix=prefix)
    store.create_schema()
    ledger = MariaDBLedger(run_id, prefix, private_mariadb.port)
    ledger.create()
    cache = PrivateRedis(tmp_path)
    cache.start()
    keys = make_keys(PROFILE, rng)
    crash_keys = {p: rng.sample(k, PROFILE.crash_keys) for p, k in keys.items()}
    config = WorkerConfig(
        store_url=private_mariadb.url, dsn=str(private_mariadb.port), prefix=prefix,
        ledger=ledger.table, crash_table=ledger.crash_table, cache_url=cache.url, lease=LEASE,
        heartbeat=HEARTBEAT, max_retries=MAX_RETRIES,
        crash_keys=[k for ks in crash_keys.values() for k in ks],
    )
    handler = IdempotencyHandler(store, metrics=None, lease_timeout=LEASE, max_retries=MAX_RETRIES)
    env = ChaosEnv(PROFILE, run_id, tmp_path, ROOT, ledger, handler, config,  # type: ignore[arg-type]
                   cache, private_mariadb, rng, crash_keys, keys)  # type: ignore[arg-type]
    try:
        yield env
    finally:
        cache.stop()
        private_mariadb.ensure_running()
        ledger.drop()
        store.drop_schema()
        store.close()


@pytest.mark.chaos
@pytest.mark.rabbitmq
@pytest.mark.timeout(PROFILE.timeout)
def test_dramatiq_on_mariadb_ledger_under_chaos(rabbit_vhost: RabbitVhost,
                                                mariadb_env: ChaosEnv) -> None:
    integration = MariaDBDramatiq(rabbit_vhost, mariadb_env.run_id)
    try:
        summary = run_chaos(integration, mariadb_env)
    finally:
        integration.close()
    assert summary["ledger"]["transactional"]["doubles"] == 0
    assert summary["pg_restarts"] == PROFILE.pg_restarts  # MariaDB restarts, here

