"""Effects outside the database with real Celery workers: a body of three recorded steps
(tests/_three_steps.py) whose worker is SIGKILLed after the second step.

Worker subprocesses (solo pool) on RabbitMQ, the SQL store on a SQLite file the test owns
(tests/celery/crash_app.py).  The killed worker's message comes back (``acks_late``); once the
lease expires the redelivery takes the scope over and — per the operation's ``on_stuck`` —
runs only the third step, or asks ``reconcile`` first: ``done`` records its result and runs
nothing, ``notdone`` replays steps one and two and runs the third, ``unknown`` parks the
scope UNCERTAIN and fails the task (no requeue) until an operator resolves it.  Every step's
effect is counted in a file: each happens exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult

from idempotent_tasks import IdempotencyHandler, SQLStore, Status
from tests._services import RABBITMQ_URL, REDIS_URL
from tests._three_steps import RECONCILED_RESULT, counted, held_by, inside_by
from tests._wait import budget

from .conftest import wait_for
from .test_crash import crash_env, start_worker  # noqa: F401 - the fixture

ALL_STEPS = ["charge done", "email done", "ledger done"]
ONCE_EACH = {"charge": 1, "email": 1, "ledger": 1}
FIRST_TWO = {"charge": 1, "email": 1, "ledger": 0}
UNCERTAIN = r"OUTCOME_UNCERTAIN|the processor has no charge"


class Cluster:
    """A client app, the worker subprocesses it started, and the shared store."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.app = Celery("effects_client", broker=RABBITMQ_URL, backend=REDIS_URL,
                          set_as_current=False)
        self.app.conf.task_default_queue = env["IT_CRASH_QUEUE"]
        self.store = SQLStore(env["IT_CRASH_STORE"])
        self.handler = IdempotencyHandler(self.store, metrics=None)
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self) -> None:
        self.workers.append(start_worker(self.env, self.workdir / "workers.log"))

    def send(self, task: str, key: str) -> AsyncResult:
        return self.app.send_task(task, args=("o-1",), headers={
            "idempotency_key": key, "idempotency_tenant": "acme"})

    def kill_after_the_second_step(self, key: str, result: AsyncResult) -> None:
        wait_for(lambda: held_by(self.workdir, key) is not None or result.ready(), timeout=60,
                 what="the first attempt to finish its second step")
        worker = self.workers[-1]
        assert held_by(self.workdir, key) == worker.pid, result.result
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(budget(10))
        assert counted(self.workdir) == FIRST_TWO

    def record(self, task: str, key: str) -> Any:
        return self.handler.get_record(operation=task, tenant="acme", key=key)

    def reconciled(self) -> list[str]:
        path = self.workdir / "reconciled"
        return path.read_text().splitlines() if path.exists() else []

    def close(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.kill()
                w.wait(budget(10))
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(self.env["IT_CRASH_QUEUE"])
        self.handler.close()
        self.store.close()


@pytest.fixture
def cluster(crash_env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(crash_env, tmp_path)
    try:
        yield c
    finally:
        c.close()


def crashed(cluster: Cluster, task: str, answer: str) -> tuple[str, AsyncResult]:
    """Send ``task`` with a key naming ``reconcile``'s answer, SIGKILL its worker after the
    second step, start a fresh worker for the redelivery."""
    key = f"{answer}-{uuid.uuid4().hex}"
    cluster.start_worker()
    result = cluster.send(task, key)
    cluster.kill_after_the_second_step(key, result)
    cluster.start_worker()
    return key, result


def test_the_takeover_runs_only_the_step_the_killed_worker_had_not_recorded(
    cluster: Cluster,
) -> None:
    key, result = crashed(cluster, "crash.steps", "plain")
    assert result.get(timeout=budget(60)) == ALL_STEPS
    assert counted(cluster.workdir) == ONCE_EACH
    record = cluster.record("crash.steps", key)
    assert record.status is Status.SUCCESS and record.retry_count == 1


@pytest.mark.parametrize(("answer", "expected", "effects"), [
    ("done", RECONCILED_RESULT, FIRST_TWO),  # the result recorded, no step runs again
    ("notdone", ALL_STEPS, ONCE_EACH),  # steps one and two replayed, the third runs
])
def test_reconcile_decides_what_the_takeover_runs(
    cluster: Cluster, answer: str, expected: list[str], effects: dict[str, int]
) -> None:
    key, result = crashed(cluster, "crash.reconciled", answer)
    assert result.get(timeout=budget(60)) == expected
    assert counted(cluster.workdir) == effects
    assert cluster.reconciled() == [answer]
    record = cluster.record("crash.reconciled", key)
    assert record.status is Status.SUCCESS and record.retry_count == 1


def test_unknown_parks_the_scope_until_an_operator_retries_it(cluster: Cluster) -> None:
    key, result = crashed(cluster, "crash.reconciled", "unknown")
    with pytest.raises(Exception, match=UNCERTAIN):
        result.get(timeout=budget(60))
    record = cluster.record("crash.reconciled", key)
    assert record.status is Status.UNCERTAIN
    assert counted(cluster.workdir) == FIRST_TWO  # nothing ran again
    duplicate = cluster.send("crash.reconciled", key)
    with pytest.raises(Exception, match=UNCERTAIN):
        duplicate.get(timeout=budget(60))
    cluster.handler.resolve(operation="crash.reconciled", tenant="acme", key=key, retry=True,
                            by="test")
    again = cluster.send("crash.reconciled", key)
    assert again.get(timeout=budget(60)) == ALL_STEPS
    assert counted(cluster.workdir) == ONCE_EACH
    assert cluster.reconciled() == ["unknown"]
    assert cluster.record("crash.reconciled", key).status is Status.SUCCESS


def test_a_frozen_owner_finishing_a_step_after_the_takeover_is_fenced_off(
    cluster: Cluster,
) -> None:
    """The first worker is stopped (SIGSTOP: its heartbeat too) inside the e-mail step, past
    its lease; a duplicate delivery on a second worker takes the scope over and finishes it.
    Resumed (SIGCONT), the first worker completes its e-mail effect — the one-step window
    the module docstring of ``_core/steps.py`` names — but its step result is refused (a
    newer attempt owns the scope): the record keeps the takeover's steps and result, and the
    first message, delivered again, gets that result."""
    key = f"fenced-{uuid.uuid4().hex}"
    go = cluster.workdir / f"go-{key}"
    os.mkfifo(go)
    cluster.start_worker()
    first = cluster.send("crash.fenced", key)
    wait_for(lambda: inside_by(cluster.workdir, key) is not None or first.ready(), timeout=60,
             what="the first attempt inside its e-mail step")
    frozen = cluster.workers[-1]
    assert inside_by(cluster.workdir, key) == frozen.pid, first.result
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        cluster.start_worker()
        taken = cluster.send("crash.fenced", key).get(timeout=budget(60))
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    taker = cluster.workers[-1].pid
    assert taken == ["charge done", f"email done by {taker}", "ledger done"]
    go.open("wb").close()  # once the resumed owner opens it to read: EOF, on it goes
    assert first.get(timeout=budget(60)) == taken
    record = cluster.record("crash.fenced", key)
    assert record.status is Status.SUCCESS and record.response == taken
    assert record.retry_count == 1
    assert counted(cluster.workdir) == {"charge": 1, "email": 2, "ledger": 1}
