"""A producer that takes a unique-enqueue mark and then hangs in its publish (run as a
subprocess by tests/celery/test_unique.py, which SIGKILLs it there).

Its broker URL points at a TCP listener that accepts and never speaks AMQP, so the publish
blocks in the connection handshake: the process dies between the mark and the publish
without any hook in the library.

    python -m tests.celery.unique_producer REDIS_PREFIX SILENT_PORT TASK_NAME KEY LEASE
"""

from __future__ import annotations

import sys

from celery import Celery

from idempotent_tasks import IdempotencyHandler, RedisStore
from idempotent_tasks.celery import enqueue_unique, setup
from tests._services import REDIS_URL


def main(prefix: str, port: str, name: str, key: str, lease: str) -> None:
    app = Celery("unique_producer", broker=f"amqp://guest:guest@127.0.0.1:{port}//",
                 set_as_current=False)
    app.conf.update(broker_connection_timeout=600, task_publish_retry=False)
    handler = IdempotencyHandler(RedisStore(REDIS_URL, prefix=prefix), metrics=None)
    setup(app, handler, beat=False)

    @app.task(name=name, shared=False)  # type: ignore[untyped-decorator]
    def report() -> None: ...

    enqueue_unique(report, key=key, tenant="acme", lease_timeout=float(lease))
    raise SystemExit("the publish returned: the listener was not silent")


if __name__ == "__main__":
    main(*sys.argv[1:])
