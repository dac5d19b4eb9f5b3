"""A Dramatiq producer that takes a unique-enqueue mark and then hangs in its publish (run as
a subprocess by tests/dramatiq/test_unique.py, which SIGKILLs it there).

Its broker URL points at a TCP listener that accepts and never speaks AMQP, so the enqueue
blocks in the connection handshake: the process dies between the mark and the publish
without any hook in the library.

    python -m tests.dramatiq.unique_producer REDIS_PREFIX SILENT_PORT ACTOR QUEUE KEY LEASE
"""

from __future__ import annotations

import sys

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from idempotent_tasks import IdempotencyHandler, RedisStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware, enqueue_unique
from tests._services import REDIS_URL


def main(prefix: str, port: str, name: str, queue: str, key: str, lease: str) -> None:
    silent = f"amqp://guest:guest@127.0.0.1:{port}/%2F?stack_timeout=600&socket_timeout=600"
    broker = RabbitmqBroker(url=silent)
    handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
    broker.add_middleware(IdempotencyMiddleware(handler, maintenance=False))

    def report() -> None: ...

    actor = dramatiq.actor(report, broker=broker, actor_name=name, queue_name=queue)
    enqueue_unique(actor, key=key, tenant="acme", lease_timeout=float(lease))
    raise SystemExit("the enqueue returned: the listener was not silent")


if __name__ == "__main__":
    main(*sys.argv[1:])
