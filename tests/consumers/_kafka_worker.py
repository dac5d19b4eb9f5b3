"""A consumer *process* for the crash test: ``python _kafka_worker.py CONFIG_JSON``.

The body records its effect in the ``effects`` table of the store's SQLite file.  With
``crash_at`` set, the body of that message first writes a marker file (so the test knows it
is inside the body) and then blocks until the process is SIGKILLed — before its effect in
``plain`` mode, after it (inside the open transaction) in ``transactional`` mode.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.consumers import IdempotentConsumer
from idempotent_tasks.consumers.kafka import KafkaConsumerLoop


def main() -> None:
    cfg = json.loads(sys.argv[1])
    db, crash_at, marker = cfg["db"], cfg.get("crash_at"), Path(cfg["marker"])
    handler = IdempotencyHandler(SQLStore(f"sqlite:///{db}"), metrics=None, lease_timeout=3)
    transactional = cfg["mode"] == "transactional"
    consumer = IdempotentConsumer(
        handler, operation="orders.created", default_tenant="acme", transactional=transactional
    )
    effects = sqlite3.connect(db, timeout=30, isolation_level=None)

    def block() -> None:
        marker.write_text(str(os.getpid()))
        threading.Event().wait()  # until SIGKILL

    def plain(payload: Any) -> int:
        if payload["i"] == crash_at:
            block()
        effects.execute("INSERT INTO effects (k, pid) VALUES (?, ?)", (payload["i"], os.getpid()))
        return int(payload["i"])

    def in_transaction(payload: Any, conn: Any) -> int:
        from sqlalchemy import text

        conn.execute(text("INSERT INTO effects (k, pid) VALUES (:k, :p)"),
                     {"k": payload["i"], "p": os.getpid()})
        if payload["i"] == crash_at:
            block()
        return int(payload["i"])

    loop = KafkaConsumerLoop(
        consumer, cfg["kafka"], topics=[cfg["topic"]], batch_size=cfg["batch_size"],
        retry_backoff=(0.2, 1.0),
    )
    loop.run(in_transaction if transactional else plain)  # until SIGTERM


if __name__ == "__main__":
    main()
