"""Fixtures of the outbox tests: a SQL store (SQLite file or PostgreSQL, a table prefix of
its own) with a ledger table, a RabbitMQ vhost of the session, the session's Tansu broker,
and a publisher that records what it is given (for the relay's own bookkeeping)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.outbox import Outbox, OutboxRow
from idempotent_tasks.outbox.publishers import SENT, PublishResult
from idempotent_tasks.testing import FakeClock
from tests._services import POSTGRES_URL, private_vhost, require
from tests._wait import wait_until as _wait_until
from tests.consumers.conftest import kafka_bootstrap  # noqa: F401  (the session's Tansu)

TENANT = "acme"


@dataclass
class Env:
    """A store with its schema, its outbox, a ledger table and a handler on a fake clock."""

    store: SQLStore
    outbox: Outbox
    ledger: sa.Table
    handler: IdempotencyHandler
    clock: FakeClock
    kind: str

    def ledger_rows(self) -> list[tuple[str, str]]:
        with self.store.engine.connect() as conn:
            return [(r.hop, r.key) for r in conn.execute(
                sa.select(self.ledger.c.hop, self.ledger.c.key).order_by(self.ledger.c.id))]

    def write(self, conn: sa.Connection, hop: str, key: str) -> None:
        conn.execute(sa.insert(self.ledger).values(hop=hop, key=key))


def make_env(kind: str, tmp_path: Path, **handler_options: Any) -> Env:
    prefix = f"ob_{uuid.uuid4().hex[:10]}"
    if kind == "postgres":
        require("postgres")
        url = POSTGRES_URL
    else:
        url = f"sqlite:///{tmp_path / 'outbox.db'}"
    store = SQLStore(url, table_prefix=prefix)
    store.create_schema()
    md = sa.MetaData()
    ledger = sa.Table(
        f"{prefix}_ledger", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hop", sa.String(16), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
    )
    md.create_all(store.engine)
    clock = FakeClock(time.time())
    handler = IdempotencyHandler(store, metrics=None, clock=clock, **handler_options)
    return Env(store, Outbox(store), ledger, handler, clock, kind)


def drop_env(env: Env) -> None:
    env.ledger.metadata.drop_all(env.store.engine)
    env.store.drop_schema()
    env.store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    made = make_env(request.param, tmp_path)
    try:
        yield made
    finally:
        drop_env(made)


@pytest.fixture
def pg_env(tmp_path: Path) -> Iterator[Env]:
    made = make_env("postgres", tmp_path)
    try:
        yield made
    finally:
        drop_env(made)


@dataclass
class Recorder:
    """A publisher that keeps what it is handed and answers with ``answer(row)``."""

    kind: str
    answer: Callable[[OutboxRow], PublishResult] = lambda _row: SENT
    rows: list[OutboxRow] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        with self.lock:
            self.rows.extend(rows)
        return [self.answer(r) for r in rows]

    def close(self) -> None:
        return None


class NoSettle:
    """The outbox as a relay sees it that dies between the broker's confirm and its mark:
    everything works but recording what was published."""

    def __init__(self, outbox: Any) -> None:
        self._outbox = outbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outbox, name)

    def settle(self, **_: Any) -> None:
        from idempotent_tasks import StoreUnavailableError

        raise StoreUnavailableError("killed before marking")


@pytest.fixture(scope="session")
def rabbit_url() -> Iterator[str]:
    """An AMQP URL on a vhost of the session's own, deleted (with its queues) at the end."""
    with private_vhost("outbox") as url:
        yield url


def declare_queue(url: str, name: str | None = None) -> str:
    import amqp

    from idempotent_tasks.outbox.publishers._rabbitmq import connection_options

    queue = name or f"q-{uuid.uuid4().hex[:8]}"
    conn = amqp.Connection(**connection_options(url))
    conn.connect()
    try:
        conn.channel().queue_declare(queue, durable=True, auto_delete=False)
    finally:
        conn.close()
    return queue


def read_queue(url: str, queue: str, count: int, timeout: float = 20.0) -> list[Any]:
    """``count`` messages of ``queue`` (basic.get, acked), in queue order."""
    import amqp

    from idempotent_tasks.outbox.publishers._rabbitmq import connection_options

    conn = amqp.Connection(**connection_options(url))
    conn.connect()
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        channel = conn.channel()
        while len(got) < count and time.monotonic() < deadline:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                time.sleep(0.02)  # polling a queue another process fills
                continue
            got.append(message)
    finally:
        conn.close()
    return got


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a condition that the code under test makes true (never a sleep that hopes)."""
    _wait_until(condition, what, timeout)
