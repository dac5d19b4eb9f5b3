"""What the unique-enqueue test modules share: a Celery app on RabbitMQ (publisher confirms
on, so a confirmed message is in its queue) with the Redis store, one worker thread, and
events that force the windows (a body waits on its gate; ``started`` says it runs)."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery import Celery

from idempotent_tasks import IdempotencyHandler, Record, RedisStore
from idempotent_tasks.celery import setup
from tests._services import REDIS_URL, require

from .conftest import Counter, new_app, running_worker

TENANT = "acme"


@dataclass
class UniqueEnv:
    app: Celery
    handler: IdempotencyHandler
    prefix: str
    tasks: dict[str, Any] = field(default_factory=dict)
    runs: Counter = field(default_factory=Counter)
    started: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))
    gates: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))
    queues: list[str] = field(default_factory=list)

    def mark(self, task: Any, k: str) -> Record | None:
        return self.handler.get_record(operation=f"enqueue:{task.name}", tenant=TENANT, key=k)

    def held_queue(self) -> str:
        """A queue no worker consumes (deleted when the module's worker stops)."""
        queue = f"held_{uuid.uuid4().hex[:8]}"
        self.queues.append(queue)
        return queue

    def queued(self, queue: str) -> int:
        """Messages the broker holds in ``queue`` (declared here if missing)."""
        with self.app.connection_for_write() as conn:
            declared = conn.default_channel.queue_declare(queue, durable=True, auto_delete=False)
            return int(declared.message_count)

    def drop(self, queue: str) -> None:
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


E = TypeVar("E", bound=UniqueEnv)


@contextmanager
def running_env(name: str, make: Callable[[Celery, IdempotencyHandler, str], E]) -> Iterator[E]:
    """``make(app, handler, prefix)`` (which declares the tasks), then a worker with one
    thread; afterwards every gate is opened and the queues and the store's data dropped."""
    require("redis")
    app = new_app(name, broker_transport_options={"confirm_publish": True})
    prefix = f"it_{uuid.uuid4().hex[:10]}"
    store = RedisStore(REDIS_URL, prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None, lease_timeout=30)
    setup(app, handler, beat=False)
    e = make(app, handler, prefix)
    try:
        with running_worker(app, concurrency=1):
            try:
                yield e
            finally:
                for gate in e.gates.values():
                    gate.set()
    finally:
        for queue in e.queues:
            e.drop(queue)
        store.drop_schema()
        store.close()
