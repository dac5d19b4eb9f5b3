"""A real Celery worker (prefork, two children) whose broker connections die while a task
body runs.

Ten idempotent tasks on a vhost of the test's own; the first run of one of them blocks.
While it blocks, every connection of the worker is killed — closed by the broker
(``rabbitmqctl close_connection`` on each connection of the vhost) or reset by the network
(the worker connects through a TCP proxy that aborts them), each verified.  RabbitMQ requeues what the dead channels held, the worker reconnects (verified:
new connections) and gets the blocked task again while its first run is still going: that
delivery must be refused as in progress (a Celery retry, not a second run).  Then the first
run is let go: its SUCCESS is recorded, its ack is lost with its channel, and the retry
replays the stored result.  Nothing lost (every task's effect), nothing run twice (each
effect once), the queue empty at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from idempotent_tasks import IdempotencyHandler, RedisStore
from tests._services import REDIS_URL, require
from tests.consumers._reconnect import ConnectionKiller, Vhost, wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TASKS = 10
GATED = "k-3"


@pytest.fixture(scope="module")
def vhost() -> Iterator[Vhost]:
    require("redis")
    v = Vhost()
    yield v
    v.delete()


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "celery", "-A", "tests.celery.reconnect_app", "worker",
           "--pool=prefork", "--concurrency=2", "--without-gossip", "--without-mingle",
           "--without-heartbeat", "-Q", env["IT_RC_QUEUE"], "--loglevel=INFO",
           "-n", f"rc{uuid.uuid4().hex[:6]}@%h"]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("fault", ["close_connection", "tcp_reset"])
def test_reconnect_when_the_connection_dies_mid_task(
    vhost: Vhost, tmp_path: Path, fault: str
) -> None:
    prefix = f"rc_{uuid.uuid4().hex[:8]}"
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    killer = ConnectionKiller(fault, vhost)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IT_RC_BROKER": killer.url(),
           "IT_RC_QUEUE": queue, "IT_RC_PREFIX": prefix, "IT_RC_GATED": GATED}
    r = redis.Redis.from_url(REDIS_URL)
    client = Celery("rc_client", broker=vhost.url(), set_as_current=False)
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    keys = [f"k-{i}" for i in range(TASKS)]
    try:
        for key in keys:
            client.send_task("reconnect.charge", args=(key,), queue=queue,
                             headers={"idempotency_key": key, "idempotency_tenant": "acme"})
        wait_until(lambda: r.llen(f"{prefix}:in-gate") == 1 or worker.poll() is not None,
                   "the gated task to start")
        assert worker.poll() is None, log.read_text()[-3000:]

        assert killer.kill() > 0  # mid-task: the body is blocked in a child
        wait_until(lambda: GATED.encode() in r.lrange(f"{prefix}:duplicate_in_progress", 0, -1),
                   "the redelivery to be refused as in progress")
        r.rpush(f"{prefix}:gate", "open")
        wait_until(lambda: len(r.hgetall(f"{prefix}:effects")) == TASKS,
                   "every task's effect", timeout=90)
        wait_until(lambda: GATED.encode() in r.lrange(f"{prefix}:duplicate_replayed", 0, -1),
                   "the retry of the refused delivery to replay the stored result")
        effects = {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}:effects").items()}
        assert effects == dict.fromkeys(keys, 1)  # nothing lost, nothing run twice
        wait_until(killer.reconnected, "the worker to reconnect")

        handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
        record = handler.get_record(operation="reconnect.charge", tenant="acme", key=GATED)
        assert record is not None and record.status.value == "SUCCESS"
        assert record.retry_count == 0  # the refused delivery was not counted
        worker.send_signal(signal.SIGTERM)  # warm shutdown: what is unacked comes back
        assert worker.wait(60) == 0, log.read_text()[-3000:]
        assert ready(client, queue) == 0, "a task was left unacked"
    finally:
        killer.close()
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
        with client.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        keys_left = list(r.scan_iter(match=f"{prefix}:*"))
        if keys_left:
            r.delete(*keys_left)
        RedisStore(REDIS_URL, prefix=prefix).drop_schema()


def ready(client: Celery, queue: str) -> int:
    with client.connection_for_write() as conn:
        _, count, _ = conn.default_channel.queue_declare(queue, passive=True)
        return int(count)
