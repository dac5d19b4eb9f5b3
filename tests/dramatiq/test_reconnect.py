"""A real Dramatiq worker process whose RabbitMQ connections die while an actor body runs.

Ten idempotent messages on a vhost of the test's own; the first run of one of them blocks.
While it blocks, every connection of the worker is killed — closed by the broker
(``rabbitmqctl close_connection`` on each connection of the vhost) or reset by the network
(the worker connects through a TCP proxy that aborts them), each verified.  RabbitMQ requeues what the dead channels held; the worker's consumer reconnects
(verified: new connections) and gets the blocked message again while its first run is still
going: the engine must refuse it as in progress (a retry, not a second run).  Then the first
run is let go: its SUCCESS is recorded, its ack is lost with its connection, and the retry
replays.  Nothing lost (every message's effect), nothing run twice (each effect once), every
queue of the vhost empty at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from idempotent_tasks import IdempotencyHandler, RedisStore
from tests._services import REDIS_URL, require
from tests.consumers._reconnect import ConnectionKiller, Vhost, wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10
GATED = "k-3"


@pytest.fixture(scope="module")
def vhost() -> Iterator[Vhost]:
    require("redis")
    v = Vhost()
    yield v
    v.delete()  # and with it every queue the test and the worker declared


def send(url: str, queue: str, keys: list[str]) -> None:
    broker = RabbitmqBroker(url=url, middleware=[])
    try:
        broker.declare_queue(queue)
        for key in keys:
            message: dramatiq.Message[Any] = dramatiq.Message(
                queue_name=queue, actor_name="charge", args=(key,), kwargs={},
                options={"idempotency_key": key, "tenant": "acme"},
            )
            broker.enqueue(message)
    finally:
        broker.close()


def counts(url: str, queue: str) -> tuple[int, int, int]:
    """Messages in the queue, its delay queue and its dead-letter queue."""
    broker = RabbitmqBroker(url=url, middleware=[])
    try:
        queued, delayed, dead = broker.get_queue_message_counts(queue)
        return int(queued), int(delayed), int(dead)
    finally:
        broker.close()


@pytest.mark.parametrize("fault", ["close_connection", "tcp_reset"])
def test_reconnect_when_the_connection_dies_mid_actor(
    vhost: Vhost, tmp_path: Path, fault: str
) -> None:
    prefix = f"rc_{uuid.uuid4().hex[:8]}"
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    killer = ConnectionKiller(fault, vhost)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IT_RC_BROKER": killer.url(),
           "IT_RC_QUEUE": queue, "IT_RC_PREFIX": prefix, "IT_RC_GATED": GATED}
    r = redis.Redis.from_url(REDIS_URL)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "tests.dramatiq.reconnect_app", "--processes", "1",
         "--threads", "2"], cwd=ROOT, env=env, stdout=log.open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    keys = [f"k-{i}" for i in range(MESSAGES)]
    try:
        send(vhost.url(), queue, keys)
        wait_until(lambda: r.llen(f"{prefix}:in-gate") == 1 or worker.poll() is not None,
                   "the gated actor to start")
        assert worker.poll() is None, log.read_text()[-3000:]

        assert killer.kill() > 0  # mid-actor: the body is blocked in a worker thread
        wait_until(lambda: GATED.encode() in r.lrange(f"{prefix}:duplicate_in_progress", 0, -1),
                   "the redelivery to be refused as in progress")
        r.rpush(f"{prefix}:gate", "open")
        wait_until(lambda: len(r.hgetall(f"{prefix}:effects")) == MESSAGES,
                   "every message's effect", timeout=90)
        wait_until(lambda: GATED.encode() in r.lrange(f"{prefix}:duplicate_replayed", 0, -1),
                   "the retry of the refused delivery to replay the stored result")
        effects = {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}:effects").items()}
        assert effects == dict.fromkeys(keys, 1)  # nothing lost, nothing run twice
        wait_until(killer.reconnected, "the worker to reconnect")

        handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
        record = handler.get_record(operation="charge", tenant="acme", key=GATED)
        assert record is not None and record.status.value == "SUCCESS"
        assert record.retry_count == 0  # the refused delivery was not counted
        wait_until(lambda: counts(vhost.url(), queue) == (0, 0, 0), "the queues to drain")
        worker.send_signal(signal.SIGTERM)  # clean shutdown: what is unacked comes back
        assert worker.wait(60) == 0, log.read_text()[-3000:]
        assert counts(vhost.url(), queue) == (0, 0, 0), "a message was left unacked"
    finally:
        killer.close()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        left = list(r.scan_iter(match=f"{prefix}:*"))
        if left:
            r.delete(*left)
        r.close()
