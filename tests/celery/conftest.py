"""Shared pieces for the Celery tests: real RabbitMQ broker, Redis result backend, real workers.

Every test module builds its own Celery app on its own queue (``unique queue names``) and runs
one in-process worker (``start_worker``, threads pool) for the whole module; the crash test
runs worker *subprocesses*.  ``broker_heartbeat = 0`` only makes the embedded worker stop in
~1 s instead of ~10 s (its poll wakes on the heartbeat timer); the setting is reported by
``check_configuration`` and covered there.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests._services import RABBITMQ_URL, REDIS_URL, require
from tests._wait import wait_until as _wait_until

RESULT_TIMEOUT = 20.0


def new_app(name: str, **conf: Any) -> Celery:
    """A Celery app on RabbitMQ with a Redis result backend and a queue of its own."""
    require("rabbitmq")
    require("redis")
    queue = f"it_{name}_{uuid.uuid4().hex[:8]}"
    app = Celery(name, broker=RABBITMQ_URL, backend=REDIS_URL, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_heartbeat=0,
        result_expires=600,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # the threads pool on RabbitMQ: Celery's post-reconnect prefetch restore reads the
        # consumer connection from pool threads (docs/celery.md); what the library warns about
        worker_enable_prefetch_count_reduction=False,
        **conf,
    )
    return app


@contextmanager
def running_worker(app: Celery, concurrency: int = 4) -> Iterator[Any]:
    """A real worker consuming the app's queue in this process (threads pool)."""
    with start_worker(
        app, pool="threads", concurrency=concurrency, perform_ping_check=False,
        shutdown_timeout=30, loglevel="CRITICAL",
    ) as worker:
        yield worker
    with app.connection_for_write() as conn:  # leave nothing behind on the broker
        conn.default_channel.queue_delete(app.conf.task_default_queue)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Wait for a condition another thread/process makes true (bounded; fails loudly)."""
    _wait_until(predicate, what or repr(predicate), timeout, poll=0.01)


class Counter:
    """Thread-safe run counter per name: how many times each body really ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def hit(self, name: str) -> int:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1
            return self.counts[name]

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self.counts.get(name, 0)


def key() -> str:
    return f"k-{uuid.uuid4()}"
