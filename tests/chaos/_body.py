"""What every chaos worker process runs: the handler it builds and the ledger bodies.

A body writes exactly one ledger row per *execution* (never per delivery) and returns
``{"key": key, "token": token}``, the token being unique to that execution and also stored in
its row, so the harness can tell which execution a stored or replayed result came from.

``transactional`` bodies write the row through the store's transaction (docs/transactional.md);
``plain`` bodies commit it on their own connection before the outcome is written — the window
in which a crash leaves an effect behind a PROCESSING record.  With ``plain_steps`` (the
``…-steps`` runs) the plain body is written as a recorded step whose insert is keyed by
``ctx.derived_key("ledger")`` under a unique constraint, as a downstream service deduplicating
by an idempotency key would: a re-run of the step after a crash finds the row and returns its
token instead of writing a second one.  A few *crash keys* make that
window certain: the first execution of such a key kills its own worker process group right
after the ledger write (once per key: a committed marker row decides).  A few *slow keys*
(the Celery Redis-broker run) hold their body for ``slow_seconds``, longer than the broker's
``visibility_timeout``, so that the broker delivers them again while they run; the body logs
``chaos_slow_body`` with its start and end (epoch seconds) for the harness to line the
redeliveries up with.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, RedisCache, SQLStore, current_context

TENANT = "chaos"
OPERATIONS = {"transactional": "chaos.tx", "plain": "chaos.plain"}
CONFIG_ENV = "CHAOS_WORKER_CONFIG"
LOG = logging.getLogger("chaos")


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs, passed as JSON in ``CHAOS_WORKER_CONFIG``."""

    store_url: str
    dsn: str
    prefix: str
    ledger: str
    crash_table: str
    cache_url: str
    lease: float
    heartbeat: float
    max_retries: int
    crash_keys: list[str] = field(default_factory=list)
    broker_url: str = ""
    queue: str = ""
    result_url: str = ""
    result_namespace: str = ""
    kafka: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)
    outcomes_dir: str = ""
    broker_options: dict[str, Any] = field(default_factory=dict)
    slow_keys: list[str] = field(default_factory=list)
    slow_seconds: float = 0.0
    plain_steps: bool = False

    def to_env(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_env(cls) -> WorkerConfig:
        return cls(**json.loads(os.environ[CONFIG_ENV]))


def make_handler(cfg: WorkerConfig) -> IdempotencyHandler:
    """The handler every worker uses: SQLStore on PostgreSQL, RedisCache on a private Redis,
    short leases with heartbeats, and a retry budget that faults alone cannot exhaust."""
    return IdempotencyHandler(
        SQLStore(cfg.store_url, table_prefix=cfg.prefix),
        RedisCache(cfg.cache_url, prefix=cfg.prefix),
        lease_timeout=cfg.lease,
        heartbeat_interval=cfg.heartbeat,
        max_retries=cfg.max_retries,
        metrics=None,
    )


class LedgerWriter:
    """One INSERT per execution; crash keys die once right after their effect."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.crash_keys = frozenset(cfg.crash_keys)
        self.slow_keys = frozenset(cfg.slow_keys)
        self._local = threading.local()
        self._insert = (
            f"INSERT INTO {cfg.ledger} (profile, key, token, pid) VALUES (%s, %s, %s, %s)"
        )
        self._insert_tx = sa.text(
            f"INSERT INTO {cfg.ledger} (profile, key, token, pid) "
            "VALUES (:profile, :key, :token, :pid)"
        )
        self._insert_keyed = (
            f"INSERT INTO {cfg.ledger} (profile, key, token, pid, dkey) "
            "VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (dkey) DO UPDATE SET dkey = EXCLUDED.dkey RETURNING token"
        )
        self._mark = (
            f"INSERT INTO {cfg.crash_table} (key, pid) VALUES (%s, %s) "
            "ON CONFLICT DO NOTHING RETURNING key"
        )

    def plain(self, key: str) -> dict[str, str]:
        """The effect commits on its own connection, before the outcome is written."""
        if self.cfg.plain_steps:
            return self.plain_steps(key)
        token = uuid.uuid4().hex
        self._maybe_hold(key)
        self._execute(self._insert, ("plain", key, token, os.getpid()))
        self._maybe_crash(key)
        return {"key": key, "token": token}

    def plain_steps(self, key: str) -> dict[str, str]:
        """The plain effect as a recorded step keyed downstream by ``ctx.derived_key``."""
        ctx = current_context()
        assert ctx is not None
        self._maybe_hold(key)
        token: str = ctx.step("ledger", self._keyed_row, key, ctx.derived_key("ledger"))
        return {"key": key, "token": token}

    def _keyed_row(self, key: str, dkey: str) -> str:
        """Insert the row under ``dkey``, or find the one a crashed attempt wrote: its token."""
        row = self._first(self._insert_keyed, ("plain", key, uuid.uuid4().hex, os.getpid(), dkey))
        assert row is not None
        self._maybe_crash(key)  # after the effect, before the step is recorded
        return str(row[0])

    def transactional(self, conn: Any, key: str) -> dict[str, str]:
        """The effect is written in the transaction that also records SUCCESS (docs/transactional.md)."""
        token = uuid.uuid4().hex
        self._maybe_hold(key)
        conn.execute(
            self._insert_tx,
            {"profile": "transactional", "key": key, "token": token, "pid": os.getpid()},
        )
        self._maybe_crash(key)
        return {"key": key, "token": token}

    def _maybe_hold(self, key: str) -> None:
        if key in self.slow_keys:
            start = time.time()
            time.sleep(self.cfg.slow_seconds)  # a long body: past the visibility_timeout
            LOG.warning("chaos_slow_body key=%s start=%.3f end=%.3f", key, start, time.time())

    def _maybe_crash(self, key: str) -> None:
        if key in self.crash_keys and self._execute(self._mark, (key, os.getpid())):
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the whole worker, after the effect

    def _execute(self, sql: str, params: tuple[Any, ...]) -> bool:
        """Run one autocommit statement; True when it returned a row."""
        return self._first(sql, params) is not None

    def _first(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Run one autocommit statement; the first row it returned, if any."""
        conn = getattr(self._local, "conn", None)
        try:
            if conn is None:
                conn = self._local.conn = psycopg.connect(
                    self.cfg.dsn, autocommit=True, connect_timeout=3
                )
            cur = conn.execute(sql, params)
            return cur.fetchone() if cur.description is not None else None
        except psycopg.Error:
            self._local.conn = None  # reconnect next time (e.g. PostgreSQL restarted)
            if conn is not None:
                conn.close()
            raise
