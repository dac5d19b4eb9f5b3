"""Celery's ``transactional=True`` on a ``DjangoStore`` handler: the task's ORM writes commit
with its SUCCESS record — in an in-process worker, and in real worker subprocesses running
the test project, one of them SIGKILLed inside the body (exactly one row after takeover)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connections

from idempotent_tasks import Status
from idempotent_tasks.celery import setup
from idempotent_tasks.django import get_handler
from tests._services import RABBITMQ_URL, require

from .._wait import budget
from .project.celery_app import app
from .project.orders.models import Charge
from .project.orders.tasks import charge, charge_then_fail

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a condition another thread or process makes true (bounded; fails loudly)."""
    deadline = time.monotonic() + budget(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def settled(key: str, status: Status, operation: str = "orders.charge") -> Any:
    def check() -> Any:
        record = get_handler().get_record(operation=operation, tenant="acme", key=key)
        return record if record is not None and record.status is status else None

    return check


def delete_queue(name: str | None = None) -> None:
    with app.connection_for_write() as conn:  # leave nothing behind on the broker
        conn.default_channel.queue_delete(name or app.conf.task_default_queue)


@pytest.fixture
def worker(alias: str) -> Iterator[None]:
    require("rabbitmq")
    setup(app, get_handler(), beat=False)  # the handler of this test's database
    app.conf.broker_heartbeat = 0  # the embedded worker then stops in ~1 s instead of ~10 s
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                          shutdown_timeout=budget(30), loglevel="CRITICAL"):
            yield
    finally:
        delete_queue()
        gc.collect()  # the pool's threads ended: free their database connections


def test_a_transactional_task_writes_its_row_once(worker: None) -> None:
    key = f"k-{uuid.uuid4()}"
    for _ in range(2):  # the second delivery is a duplicate: replayed, no second row
        charge.apply_async(("o-1", 7), idempotency_key=key, tenant="acme")
    record = wait_for(settled(key, Status.SUCCESS), 30, "the task to succeed")
    assert record.response["order"] == "o-1"
    wait_for(lambda: Charge.objects.count() == 1, 5, "the row")
    time.sleep(0.5)  # let the duplicate delivery run: it must not add a row
    assert list(Charge.objects.values_list("order_id", "amount")) == [("o-1", 7)]


def test_a_failing_transactional_task_leaves_no_rows_and_counts(worker: None) -> None:
    key = f"k-{uuid.uuid4()}"
    charge_then_fail.apply_async(("o-2",), idempotency_key=key, tenant="acme")
    wait_for(settled(key, Status.FAILED, "orders.charge_then_fail"), 30, "the poison")
    assert Charge.objects.count() == 0
    assert get_handler().retry_count(
        operation="orders.charge_then_fail", tenant="acme", key=key) == 3


def start_worker_process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "celery", "-A", "tests.django.project.celery_app", "worker",
        "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-Q", env["IDEM_DJANGO_QUEUE"], "--loglevel=INFO", "-n", f"w{uuid.uuid4().hex[:6]}@%h",
    ]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def worker_env(alias: str, tmp_path: Path) -> dict[str, str]:
    """The test project in a subprocess, on this session's test databases."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.django.project.settings",
        "IDEM_DJANGO_PG_NAME": str(connections["default"].settings_dict["NAME"]),
        "IDEM_DJANGO_SQLITE": str(connections["sqlite"].settings_dict["NAME"]),
        "IDEM_DJANGO_DATABASE": alias,
        "IDEM_DJANGO_QUEUE": f"django_crash_{uuid.uuid4().hex[:8]}",
        "IDEM_DJANGO_BROKER": RABBITMQ_URL,
        "IDEM_DJANGO_LEASE": str(LEASE),
        "IDEM_DJANGO_HOLD": str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }


def test_a_worker_sigkilled_inside_the_body_leaves_exactly_one_row(
    alias: str, tmp_path: Path
) -> None:
    require("rabbitmq")
    env, log = worker_env(alias, tmp_path), tmp_path / "workers.log"
    workers: list[subprocess.Popen[bytes]] = []
    key = f"k-{uuid.uuid4()}"
    try:
        workers.append(start_worker_process(env, log))
        charge.apply_async(("o-3", 9), idempotency_key=key, tenant="acme",
                           queue=env["IDEM_DJANGO_QUEUE"])
        inside = wait_for(lambda: (tmp_path / "inside-1").exists(), 60, "the first attempt")
        assert inside and int((tmp_path / "inside-1").read_text()) == workers[0].pid
        assert Charge.objects.count() == 0  # written inside the body, not committed
        os.killpg(workers[0].pid, signal.SIGKILL)  # mid-body: no cleanup of any kind runs
        workers[0].wait(budget(10))
        assert Charge.objects.count() == 0  # died with its transaction
        held = get_handler().get_record(operation="orders.charge", tenant="acme", key=key)
        assert held is not None and held.status is Status.PROCESSING
        workers.append(start_worker_process(env, log))  # gets the redelivery
        record = wait_for(settled(key, Status.SUCCESS), 60, "the takeover to commit")
        assert record.retry_count == 1  # the killed attempt was counted
        assert (tmp_path / "inside-2").exists()
        assert list(Charge.objects.values_list("order_id", "amount")) == [("o-3", 9)]
    except BaseException:
        sys.stderr.write(log.read_text() if log.exists() else "(no worker log)")
        raise
    finally:
        for process in workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(budget(10))
        delete_queue(env["IDEM_DJANGO_QUEUE"])
