"""Unique enqueue for taskiq with a real worker process, on taskiq-redis and taskiq-aio-pika.

The messages are sent before the worker starts, so they are pending for sure; the bodies then
wait on gates the test opens (Redis lists), so "running" is held as long as the test needs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from idempotent_tasks.taskiq import enqueue_unique, idempotency_labels
from tests._wait import budget

from .._services import REDIS_URL
from .conftest import App, Worker

pytestmark = pytest.mark.timeout(180)
WAIT = 30.0
#: The marks' lease: the app's own (2 s) would end while the worker process starts.
LEASE = 120.0


async def until(condition: Any, what: str) -> None:
    """Poll what the worker process writes (bounded by the test budget)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget(WAIT)
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


class Effects:
    """The worker's writes, read from Redis, and the gates the bodies wait on."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.client = redis.Redis.from_url(REDIS_URL)

    def runs(self, name: str) -> int:
        return int(self.client.get(f"{self.app.prefix}:gate_runs:{name}") or 0)

    def open(self, name: str, times: int = 1) -> None:
        self.client.rpush(f"{self.app.prefix}:gate:{name}", *["go"] * times)

    def marked(self, task: str, key: str) -> bool:
        record = self.app.module.handler.get_record(operation=f"enqueue:{task}",
                                                    tenant="acme", key=key)
        return record is not None


def test_pending_running_and_finished(app: App, tmp_path: Path) -> None:
    m, fx = app.module, Effects(app)
    worker: Worker | None = None

    async def scenario() -> None:
        nonlocal worker
        gate = m.unique_gate
        first = await enqueue_unique(gate, "a", key="a", tenant="acme", lease_timeout=LEASE)
        again = await enqueue_unique(gate, "a", key="a", tenant="acme", lease_timeout=LEASE)
        assert again.task_id == first.task_id  # pending: nothing sent
        held = await enqueue_unique(gate, "b", key="b", tenant="acme", unique_until="finish",
                                      lease_timeout=LEASE)

        worker = Worker(app, tmp_path / "worker.log")
        await until(lambda: fx.runs("a") == 1 and fx.runs("b") == 1, "both bodies to start")
        started = await enqueue_unique(gate, "a", key="a", tenant="acme", lease_timeout=LEASE)
        assert started.task_id != first.task_id  # "start": released once it started
        running = await enqueue_unique(gate, "b", key="b", tenant="acme",
                                       unique_until="finish", lease_timeout=LEASE)
        assert running.task_id == held.task_id  # "finish": still running

        fx.open("b")
        assert (await held.wait_result(timeout=budget(WAIT))).return_value == "gate-b"
        await until(lambda: not fx.marked(gate.task_name, "b"), "the finish mark's release")
        later = await enqueue_unique(gate, "b", key="b", tenant="acme", unique_until="finish",
                                      lease_timeout=LEASE)
        assert later.task_id != held.task_id
        fx.open("b")
        fx.open("a", 2)
        assert (await later.wait_result(timeout=budget(WAIT))).return_value == "gate-b"
        assert (await again.wait_result(timeout=budget(WAIT))).return_value == "gate-a"
        await until(lambda: fx.runs("a") == 2, "the second message of a")

    try:
        app.run(scenario())
    finally:
        fx.open("a", 2)
        fx.open("b", 2)
        if worker is not None:
            worker.stop()
        fx.client.close()


def test_a_message_sent_again_keeps_the_mark_until_its_final_outcome(
    app: App, tmp_path: Path
) -> None:
    """``it.flaky`` fails once and is sent again by the middleware (same task id, same
    labels): not blocked by its own mark, which goes only with the final success."""
    m, fx = app.module, Effects(app)
    worker = Worker(app, tmp_path / "worker.log")

    async def scenario() -> Any:
        sent = await enqueue_unique(m.flaky, 7, key="f", tenant="acme", unique_until="finish",
                                    lease_timeout=LEASE, labels=idempotency_labels("f", "acme"))
        result = await sent.wait_result(timeout=budget(WAIT))
        await until(lambda: not fx.marked(m.flaky.task_name, "f"), "the mark's release")
        return result

    try:
        result = app.run(scenario())
    finally:
        worker.stop()
        fx.client.close()
    assert not result.is_err and result.return_value == 2  # the second attempt's answer
