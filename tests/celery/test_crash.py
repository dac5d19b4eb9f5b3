"""A worker SIGKILLed inside the body: redelivery, lease expiry, takeover, one effect.

Real worker subprocesses (solo pool) on RabbitMQ, the SQL store on a shared SQLite file.
The body signals that it started by writing a file, then blocks; the test kills the worker
with SIGKILL (no cleanup of any kind runs), starts a fresh worker, and waits for the result.
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
from celery import Celery

from idempotent_tasks import IdempotencyHandler, SQLStore, Status
from tests._services import RABBITMQ_URL, REDIS_URL, require

from .conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0


@pytest.fixture
def crash_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    require("rabbitmq")
    require("redis")
    store_url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = SQLStore(store_url)
    store.create_schema()
    store.close()
    env = {
        **os.environ,
        "IT_CRASH_DIR": str(tmp_path),
        "IT_CRASH_BROKER": RABBITMQ_URL,
        "IT_CRASH_BACKEND": REDIS_URL,
        "IT_CRASH_QUEUE": f"it_crash_{uuid.uuid4().hex[:8]}",
        "IT_CRASH_STORE": store_url,
        "IT_CRASH_LEASE": str(LEASE),
        "PYTHONPATH": str(ROOT),
    }
    yield env


def start_worker(env: dict[str, str], log: Path, pool: str = "solo") -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "celery", "-A", "tests.celery.crash_app", "worker",
        f"--pool={pool}", "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-Q", env["IT_CRASH_QUEUE"], "--loglevel=INFO", "-n", f"w{uuid.uuid4().hex[:6]}@%h",
    ]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def test_sigkill_mid_task_is_redelivered_and_taken_over_once(
    crash_env: dict[str, str], tmp_path: Path
) -> None:
    app = Celery("crash_client", broker=RABBITMQ_URL, backend=REDIS_URL, set_as_current=False)
    app.conf.task_default_queue = crash_env["IT_CRASH_QUEUE"]
    log = tmp_path / "workers.log"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        workers.append(start_worker(crash_env, log))
        k = f"k-{uuid.uuid4()}"
        result = app.send_task(
            "crash.charge", args=("o-1",),
            headers={"idempotency_key": k, "idempotency_tenant": "acme"},
        )
        started = tmp_path / "started-1"
        wait_for(started.exists, timeout=30, what="the first attempt to start")
        assert int(started.read_text()) == workers[0].pid
        os.kill(workers[0].pid, signal.SIGKILL)  # mid-task, before the effect
        workers[0].wait(10)
        workers.append(start_worker(crash_env, log))  # a fresh worker gets the redelivery
        value = result.get(timeout=60)
        assert value == "charged o-1 on attempt 2"
        assert (tmp_path / "effects").read_text().splitlines() == ["o-1"]
        store = SQLStore(crash_env["IT_CRASH_STORE"])
        handler = IdempotencyHandler(store, metrics=None)
        record = handler.get_record(operation="crash.charge", tenant="acme", key=k)
        store.close()
        assert record is not None
        assert record.status is Status.SUCCESS and record.retry_count == 1
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(crash_env["IT_CRASH_QUEUE"])


def test_hard_time_limit_kill_is_requeued_and_taken_over_once(
    crash_env: dict[str, str], tmp_path: Path
) -> None:
    """A prefork child killed by the task's hard ``time_limit`` (before its effect): the
    message is requeued, not acked (``acks_on_timeout=False``), so the lease expires, the
    redelivery takes the scope over (the killed attempt counted) and the effect happens once."""
    import celery

    if not hasattr(celery.Task, "acks_on_timeout"):
        pytest.skip("this Celery acks a hard time limit; the worker warns instead")
    app = Celery("crash_client", broker=RABBITMQ_URL, backend=REDIS_URL, set_as_current=False)
    app.conf.task_default_queue = crash_env["IT_CRASH_QUEUE"]
    log = tmp_path / "workers.log"
    worker = start_worker(crash_env, log, pool="prefork")
    store = SQLStore(crash_env["IT_CRASH_STORE"])
    handler = IdempotencyHandler(store, metrics=None)
    try:
        k = f"k-{uuid.uuid4()}"
        app.send_task("crash.slow", args=("o-1",),
                      headers={"idempotency_key": k, "idempotency_tenant": "acme"})
        effects = tmp_path / "slow-effects"
        wait_for(effects.exists, timeout=120, what="the attempt after the time-limit kill")

        def settled() -> bool:
            record = handler.get_record(operation="crash.slow", tenant="acme", key=k)
            return record is not None and record.status is Status.SUCCESS

        wait_for(settled, timeout=60, what="the takeover's SUCCESS")
        assert effects.read_text().splitlines() == ["o-1"]
        assert len(list(tmp_path.glob("slow-started-*"))) == 2
        record = handler.get_record(operation="crash.slow", tenant="acme", key=k)
        assert record is not None and record.retry_count == 1
        assert "Hard time limit" in log.read_text()  # the fault happened
    finally:
        store.close()
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(crash_env["IT_CRASH_QUEUE"])
