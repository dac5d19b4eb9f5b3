"""A chaos consumer process (``python -m tests.chaos.kafka_worker``): one
``KafkaConsumerLoop`` per ledger profile, each on its own topic and group, in two threads.

Every settled outcome (``executed`` / ``replayed``) is appended, via ``on_outcome``, to a
JSON-lines file of this process, so the harness can check what each delivery got.  If a loop
dies the process exits, and the harness restarts it like a killed one.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from idempotent_tasks import MaintenanceSchedule
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

from ._body import OPERATIONS, TENANT, LedgerWriter, WorkerConfig, make_handler


class OutcomeLog:
    """Appends one JSON line per settled outcome; a torn last line is the harness's to skip."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, message: Message, outcome: Outcome) -> None:
        if outcome.kind not in ("executed", "replayed"):
            return
        line = json.dumps({
            "key": outcome.key, "kind": outcome.kind, "result": outcome.result,
            "topic": message.topic, "partition": message.partition, "offset": message.offset,
        })
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def run_profile(cfg: WorkerConfig, profile: str, log: OutcomeLog, stop: threading.Event) -> None:
    ledger = LedgerWriter(cfg)
    transactional = profile == "transactional"
    consumer = IdempotentConsumer(
        make_handler(cfg), operation=OPERATIONS[profile], default_tenant=TENANT,
        transactional=transactional,
    )

    def body(payload: Any, conn: Any = None) -> dict[str, str]:
        key = str(payload["key"])
        return ledger.transactional(conn, key) if transactional else ledger.plain(key)

    loop = KafkaConsumerLoop(
        consumer, {**cfg.kafka, "group.id": cfg.groups[profile]}, topics=[cfg.topics[profile]],
        retry_backoff=(0.1, 1.0), on_outcome=log,
        maintenance=MaintenanceSchedule(recover_every=2.0, cleanup_every=600.0),
    )
    try:
        loop.run(body, stop=stop)
    finally:
        os._exit(3)  # a loop that ended on its own: exit so that the harness restarts us


def main() -> None:
    cfg = WorkerConfig.from_env()
    log = OutcomeLog(Path(cfg.outcomes_dir) / f"{os.getpid()}.jsonl")
    stop = threading.Event()
    threads = [
        threading.Thread(target=run_profile, args=(cfg, profile, log, stop), daemon=True)
        for profile in OPERATIONS
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
