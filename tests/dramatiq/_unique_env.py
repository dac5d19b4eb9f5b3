"""What the Dramatiq unique-enqueue test modules share: a RabbitMQ broker on a private vhost
(publisher confirms on) with the idempotency middleware and the Redis store, an in-process
worker with one thread on the ``default`` queue (``held_*`` queues stay unconsumed), and
events that force the windows (a body waits on its gate; ``started`` says it runs)."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware

from idempotent_tasks import IdempotencyHandler, Record, RedisStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware
from tests._services import REDIS_URL, private_vhost, require
from tests._wait import budget, wait_until

TENANT = "acme"
WAIT = 20.0


@dataclass
class UniqueEnv:
    broker: RabbitmqBroker
    handler: IdempotencyHandler
    prefix: str
    actors: dict[str, Any] = field(default_factory=dict)
    runs: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    started: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))
    gates: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))

    def mark(self, actor: Any, k: str) -> Record | None:
        return self.handler.get_record(operation=f"enqueue:{actor.actor_name}", tenant=TENANT,
                                       key=k)

    def queued(self, queue: str) -> int:
        return int(self.broker.get_queue_message_counts(queue)[0])

    def gated(self, k: str) -> None:
        """An actor body: counts its run, says it started, waits for its gate."""
        self.runs[k] += 1
        self.started[k].set()
        assert self.gates[k].wait(budget(WAIT))


def key() -> str:
    return f"k-{uuid.uuid4()}"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    wait_until(condition, what, WAIT, poll=0.01)


E = TypeVar("E", bound=UniqueEnv)


@contextmanager
def running_env(
    vhost: str, make: Callable[[RabbitmqBroker, IdempotencyHandler, str], E],
    *first: Middleware,
) -> Iterator[E]:
    """The broker (``first`` middleware added before the idempotency one), then
    ``make(broker, handler, prefix)`` (which declares the actors), then the worker;
    afterwards every gate is opened, the worker stopped and the store's data dropped."""
    require("redis")
    with private_vhost(vhost) as url:
        broker = RabbitmqBroker(url=url, confirm_delivery=True)
        prefix = f"it_{uuid.uuid4().hex[:10]}"
        store = RedisStore(REDIS_URL, prefix=prefix)
        handler = IdempotencyHandler(store, metrics=None, lease_timeout=30)
        for middleware in first:
            broker.add_middleware(middleware)
        broker.add_middleware(IdempotencyMiddleware(handler, maintenance=False))
        e = make(broker, handler, prefix)
        worker = dramatiq.Worker(broker, queues={"default"}, worker_threads=1,
                                 worker_timeout=100)
        worker.start()
        try:
            yield e
        finally:
            for gate in e.gates.values():
                gate.set()
            worker.stop()
            broker.close()
            store.drop_schema()
            store.close()
