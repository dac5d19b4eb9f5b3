"""End to end through real Celery workers (subprocesses, solo pool, RabbitMQ, the SQL store
on a shared SQLite file) traced with OpenTelemetry's SDK and
``opentelemetry-instrumentation-celery`` (``celery_otel_app``):

1. a duplicate delivery: worker 1 runs the task and records its SUCCESS, then dies before
   the ack; RabbitMQ delivers the message again to worker 2, which replays it.  Each
   delivery's ``idempotency otel.charge`` span is a child of Celery's ``run/otel.charge``
   span, with the idempotency and messaging attributes, and the replay's span links to the
   execution's span in worker 1's trace;
2. a takeover: worker 2 is SIGKILLed inside the body; worker 3 gets the delivery again,
   finds the scope in progress until the lease expires (Celery retries, not counted), then
   takes it over: ``executed`` with ``retry_count=1`` and a greater fencing token.

``pytest -s`` prints the ASCII rendering of the spans (docs/observability.md shows one).
Time: ~20 s (three worker start-ups, one lease of 2 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from idempotent_tasks import SQLStore
from tests._services import RABBITMQ_URL, REDIS_URL, require

from ..celery.conftest import wait_for
from ._render import render

ROOT = Path(__file__).resolve().parents[2]
TASK = "otel.charge"


class Workers:
    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log = (workdir / "workers.log").open("ab")

    def start(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "celery", "-A", "tests.otel.celery_otel_app", "worker",
               "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
               "-Q", self.env["IT_OTEL_QUEUE"], "--loglevel=INFO",
               "-n", f"otel{uuid.uuid4().hex[:6]}@%h"]
        proc = subprocess.Popen(cmd, env=self.env, cwd=ROOT, stdout=self.log,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def spans(self) -> list[dict[str, Any]]:
        path = self.workdir / "spans.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.log.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    require("rabbitmq")
    require("redis")
    store_url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = SQLStore(store_url)
    store.create_schema()
    store.close()
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "IT_OTEL_DIR": str(tmp_path),
        "IT_OTEL_BROKER": RABBITMQ_URL, "IT_OTEL_BACKEND": REDIS_URL,
        "IT_OTEL_QUEUE": f"it_otel_{uuid.uuid4().hex[:8]}", "IT_OTEL_STORE": store_url,
        "IT_OTEL_LEASE": "2.0",
    }
    running = Workers(env, tmp_path)
    client = Celery("otel_client", broker=RABBITMQ_URL, set_as_current=False)
    try:
        yield running
    finally:
        running.stop()
        with client.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["IT_OTEL_QUEUE"])


def send(workers: Workers, order: str, mode: str, key: str) -> str:
    client = Celery("otel_client", broker=RABBITMQ_URL, set_as_current=False)
    client.conf.task_default_queue = workers.env["IT_OTEL_QUEUE"]
    result = client.send_task(TASK, args=(order, mode),
                              headers={"idempotency_key": key, "idempotency_tenant": "acme"})
    return str(result.id)


def decisions(spans: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == f"idempotency {TASK}"
            and s["attributes"].get("idempotency.key") == key]


def taken_over(spans: list[dict[str, Any]], key: str) -> bool:
    """The executed decision and its ``run/`` span (it ends after ours) are exported."""
    ids = {s["span_id"] for s in spans}
    return any(s["attributes"].get("idempotency.outcome") == "executed"
               and s["parent_id"] in ids for s in decisions(spans, key))


def check_under_celery(spans: list[dict[str, Any]], decision: dict[str, Any],
                       task_id: str, queue: str) -> dict[str, Any]:
    """The decision span's parent is Celery's ``run/`` span of the same task, which carries
    the ``idempotency.*`` attributes too."""
    (run,) = [s for s in spans if s["span_id"] == decision["parent_id"]]
    assert run["name"] == f"run/{TASK}" and run["trace_id"] == decision["trace_id"]
    got = decision["attributes"]
    assert got["messaging.system"] == "rabbitmq"
    assert got["messaging.destination.name"] == queue
    assert got["messaging.message.id"] == task_id
    assert got["idempotency.tenant"] == "acme" and got["idempotency.operation"] == TASK
    own = {k: v for k, v in run["attributes"].items() if k.startswith("idempotency.")}
    assert own == {k: v for k, v in got.items() if k.startswith("idempotency.")}
    return run


def test_otel_celery_worker_trace_duplicate_delivery_and_takeover(workers: Workers) -> None:
    queue = workers.env["IT_OTEL_QUEUE"]
    first_worker = workers.start()
    dup_key = f"k-{uuid.uuid4().hex[:8]}"
    dup_id = send(workers, "o-1", "kill-after-success", dup_key)
    first_worker.wait(60)  # it ran the task, recorded it, and died before the ack
    assert first_worker.returncode == -signal.SIGKILL
    second_worker = workers.start()
    wait_for(lambda: len(decisions(workers.spans(), dup_key)) == 2 and any(
        s["name"] == f"run/{TASK}" and s["pid"] == second_worker.pid for s in workers.spans()
    ), 60, "the replay's spans")
    spans = workers.spans()
    executed, replayed = decisions(spans, dup_key)
    assert executed["attributes"]["idempotency.outcome"] == "executed"
    assert replayed["attributes"]["idempotency.outcome"] == "replayed"
    assert executed["pid"] == first_worker.pid and replayed["pid"] == second_worker.pid
    check_under_celery(spans, executed, dup_id, queue)
    check_under_celery(spans, replayed, dup_id, queue)
    assert replayed["trace_id"] != executed["trace_id"]  # a delivery of its own…
    assert [(link["trace_id"], link["span_id"], link["attributes"]) for link in replayed["links"]] \
        == [(executed["trace_id"], executed["span_id"],  # …that points at the execution
             {"idempotency.link": "replayed_execution"})]
    assert replayed["attributes"]["idempotency.fencing_token"] == (
        executed["attributes"]["idempotency.fencing_token"])

    takeover_key = f"k-{uuid.uuid4().hex[:8]}"
    takeover_id = send(workers, "o-2", "block-first", takeover_key)
    wait_for((workers.workdir / "started-o-2").exists, 30, "the first attempt to start")
    os.kill(second_worker.pid, signal.SIGKILL)  # inside the body: no span of it ends
    second_worker.wait(10)
    workers.start()
    wait_for(lambda: taken_over(workers.spans(), takeover_key), 60, "the takeover's spans")
    spans = workers.spans()
    attempts = decisions(spans, takeover_key)
    kinds = [s["attributes"]["idempotency.outcome"] for s in attempts]
    assert kinds[-1] == "executed" and set(kinds[:-1]) <= {"in_progress"}, kinds
    taken = attempts[-1]
    check_under_celery(spans, taken, takeover_id, queue)
    assert taken["attributes"]["idempotency.retry_count"] == 1  # the killed attempt, counted
    assert taken["status"] == "UNSET" and not taken["links"]
    print("\n" + render([s for s in spans if s["trace_id"] in {
        executed["trace_id"], replayed["trace_id"], *(a["trace_id"] for a in attempts)}]))
