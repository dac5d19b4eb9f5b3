"""Real taskiq worker processes (``python -m taskiq worker``) on taskiq-redis (Redis Streams)
and taskiq-aio-pika (RabbitMQ, a vhost of the session), and the same app loaded in the test
process to send tasks and read their results."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests._wait import wait_until as _wait_until

from .._services import REDIS_URL, private_vhost, require

ROOT = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("worker_app.py")
KINDS = ["redis", "rabbit"]


@pytest.fixture(scope="session")
def taskiq_vhost_url() -> Iterator[str]:
    """An AMQP URL on a vhost of our own, deleted (with its queues) after the session."""
    with private_vhost("taskiq") as url:
        yield url


@dataclass
class App:
    """One configuration of ``worker_app``: its environment, and the module loaded here."""

    kind: str
    env: dict[str, str]
    module: ModuleType

    @property
    def prefix(self) -> str:
        return self.env["IT_TASKIQ_PREFIX"]

    def run(self, coro: Any) -> Any:
        """Run ``coro`` with the client broker started (and shut down after)."""
        async def main() -> Any:
            await self.module.broker.startup()
            try:
                return await coro
            finally:
                await self.module.broker.shutdown()
                await self.module._redis.aclose()

        return asyncio.run(main())


def load_app(kind: str, vhost_url: str | None, monkeypatch: pytest.MonkeyPatch) -> App:
    require("redis")
    prefix = f"it_tq_{uuid.uuid4().hex[:10]}"
    env = {"IT_TASKIQ_BROKER": kind, "IT_TASKIQ_PREFIX": prefix, "IT_TASKIQ_REDIS": REDIS_URL}
    if vhost_url is not None:
        env["IT_TASKIQ_AMQP_URL"] = vhost_url
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location(f"it_taskiq_app_{prefix}", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # taskiq registers the task functions in their module
    monkeypatch.delitem(sys.modules, spec.name)  # ... and the test removes it afterwards
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return App(kind, env, module)


@pytest.fixture(params=KINDS)
def app(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    kind = request.param
    vhost = request.getfixturevalue("taskiq_vhost_url") if kind == "rabbit" else None
    loaded = load_app(kind, vhost, monkeypatch)
    try:
        yield loaded
    finally:
        _cleanup_redis(loaded.prefix)


def _cleanup_redis(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


class Worker:
    """``python -m taskiq worker tests.taskiq.worker_app:broker`` with the app's environment
    (its manager restarts a worker process that dies, as in production)."""

    def __init__(self, app: App, log: Path) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "taskiq", "worker", "tests.taskiq.worker_app:broker",
             "--workers", "1", "--max-async-tasks", "20", "--no-configure-logging"],
            cwd=ROOT, env={**os.environ, **app.env}, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL: taskiq 0.13's worker does not always finish its graceful
        shutdown (its Redis listener keeps reading); the tests are done with it either way."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def worker(app: App, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(app, tmp_path / "worker.log")
    try:
        yield w
    finally:
        w.stop()


async def wait_ready(app: App, timeout: float = 60.0) -> None:
    """The worker answers a ping (it is consuming)."""
    task = await app.module.ping.kiq()
    result = await task.wait_result(timeout=timeout)
    assert result.return_value == "pong"


async def ping(app: App, timeout: float) -> bool:
    """One ping; False if no worker answered within ``timeout`` (e.g. it went to a consumer
    that had just been killed: it waits there until reclaimed)."""
    from taskiq.exceptions import TaskiqResultTimeoutError

    task = await app.module.ping.kiq()
    try:
        await task.wait_result(timeout=timeout)
    except TaskiqResultTimeoutError:
        return False
    return True


def wait_for(condition: Any, timeout: float, what: str) -> None:
    _wait_until(condition, what, timeout)  # polling what the worker writes
