"""A FastStream subscriber process SIGKILLed inside its body: RabbitMQ redelivers the unacked
message to the next process, which waits out the lease (in progress, uncounted) and takes the
scope over — exactly one effect, the crashed attempt counted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from idempotent_tasks import IdempotencyHandler, RedisStore, Status
from tests._wait import wait_until as _wait_until

from .._services import REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


class Subscriber:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faststream.crash_app"],
                                     cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)
        self.log.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    require("redis")
    name = f"it_fsc_{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(f"{name}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def _wait(condition: object, timeout: float, what: str) -> None:
    _wait_until(condition, what, timeout, poll=0.05)  # type: ignore[arg-type]


def test_killed_subscriber_is_redelivered_and_taken_over_once(
    rabbit_vhost_url: str, prefix: str, tmp_path: Path
) -> None:
    queue = f"it-crash-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "IT_FS_AMQP_URL": rabbit_vhost_url, "IT_FS_QUEUE": queue,
           "IT_FS_PREFIX": prefix, "IT_FS_REDIS": REDIS_URL}
    client = redis.Redis.from_url(REDIS_URL)

    def get(name: str) -> int:
        return int(client.get(f"{prefix}:{name}") or 0)

    first = Subscriber(env, tmp_path / "first.log")
    second = None
    try:
        _wait(lambda: any(True for _ in client.scan_iter(f"{prefix}:ready:*")), 60, "ready")

        async def publish() -> None:
            from faststream.rabbit import RabbitBroker

            async with RabbitBroker(rabbit_vhost_url) as broker:
                await broker.publish({"order": 1}, queue=queue, persist=True, headers={
                    "idempotency-key": "k-crash", "idempotency-tenant": "acme"})

        asyncio.run(publish())
        _wait(lambda: get("blocked_pid") != 0, 30, "the first attempt to block")
        first.kill()
        second = Subscriber(env, tmp_path / "second.log")
        _wait(lambda: get("effects") == 1, 60, "the takeover")
    finally:
        first.kill()
        if second is not None:
            second.kill()
    handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
    record = handler.get_record(operation="orders.charge", tenant="acme", key="k-crash")
    assert record is not None and record.status is Status.SUCCESS
    assert record.retry_count == 1  # the killed attempt was counted
    assert (get("attempts"), get("effects")) == (2, 1)
    client.close()
