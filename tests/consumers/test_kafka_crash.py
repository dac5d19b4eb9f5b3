"""A consumer process SIGKILLed mid-batch and restarted: every message's effect exactly once.

Per docs/guarantees.md: in plain mode the kill lands inside the body *before* its effect; with
``transactional=True`` it lands after the effect, inside the open transaction, which the
crash rolls back.  Either way the effects table ends with one row per message, and each
message that was claimed by the killed batch but not finished counts one attempt.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler

from .conftest import committed, create_topic, kafka_config, produce, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

WORKER = Path(__file__).with_name("_kafka_worker.py")
ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 12
BATCH = 4
CRASH_AT = 5  # second batch: 4 is done, 5 is in its body, 6 and 7 are claimed


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def spawn(procs: list[subprocess.Popen[bytes]], cfg: dict[str, Any], log: Path) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg)], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


@pytest.mark.parametrize("mode", ["plain", "transactional"])
def test_sigkill_mid_batch_then_restart_gives_each_effect_exactly_once(
    kafka_bootstrap: str, tmp_path: Path, processes: list[Any], mode: str
) -> None:
    from idempotent_tasks import SQLStore

    db = tmp_path / "shared.db"
    store = SQLStore(f"sqlite:///{db}")
    store.create_schema()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE effects (k INTEGER NOT NULL, pid INTEGER NOT NULL)")
    topic = create_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [
        {"value": json.dumps({"i": i}).encode(), "headers": {"idempotency-key": f"k{i}"}}
        for i in range(MESSAGES)
    ])
    kafka = kafka_config(kafka_bootstrap)
    marker = tmp_path / "inside-body"
    cfg = {"db": str(db), "topic": topic, "kafka": kafka, "batch_size": BATCH, "mode": mode,
           "marker": str(marker)}

    first = spawn(processes, {**cfg, "crash_at": CRASH_AT}, tmp_path / "first.log")
    wait_for(lambda: marker.exists() or first.poll() is not None, 60, "the body to start")
    assert first.poll() is None, (tmp_path / "first.log").read_text()
    first.kill()  # SIGKILL inside the body
    assert first.wait(10) == -signal.SIGKILL
    assert committed(kafka_bootstrap, kafka["group.id"], topic) == [BATCH]

    second = spawn(processes, cfg, tmp_path / "second.log")

    def effects() -> list[int]:
        with sqlite3.connect(db, timeout=30) as conn:
            return [row[0] for row in conn.execute("SELECT k FROM effects ORDER BY k")]

    wait_for(lambda: committed(kafka_bootstrap, kafka["group.id"], topic) == [MESSAGES]
             or second.poll() is not None, 90, "the restarted consumer to commit everything")
    assert second.poll() is None, (tmp_path / "second.log").read_text()
    assert effects() == list(range(MESSAGES))  # each exactly once
    second.send_signal(signal.SIGTERM)  # clean shutdown via the loop's signal handlers
    assert second.wait(20) == 0, (tmp_path / "second.log").read_text()

    handler = IdempotencyHandler(store, metrics=None)
    counts = {}
    for i in range(MESSAGES):
        rec = handler.get_record(operation="orders.created", tenant="acme", key=f"k{i}")
        assert rec is not None and rec.status.value == "SUCCESS" and rec.response == i
        counts[i] = rec.retry_count
    claimed_unfinished = set(range(CRASH_AT, BATCH * 2))
    assert counts == {i: int(i in claimed_unfinished) for i in range(MESSAGES)}
