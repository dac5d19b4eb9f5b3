"""The ``prefetch_reduction_with_threads_pool`` configuration risk.

After a broker reconnect Celery (5.x, ``worker_enable_prefetch_count_reduction``, on by
default) lowers the prefetch count and raises it again from each ack's callback, with a
``basic.qos`` that waits for its ``qos-ok`` on the consumer connection.  In the threads pool
that callback runs in the pool thread, which then reads the connection while the worker's main
thread reads it too: the frame stream desynchronises (``UnexpectedFrame``, or a worker stuck
in a read of a garbage frame header, holding its prefetched messages unacked).  The risk is
flagged for the threads pool on an AMQP broker while the reduction is on.
"""

from __future__ import annotations

from celery import Celery
from celery.concurrency.thread import TaskPool

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.celery import check_configuration, setup
from idempotent_tasks.celery._risks import find_risks

RISK = "prefetch_reduction_with_threads_pool"


def _app(broker: str, **conf: object) -> Celery:
    app = Celery("threads_risk", broker=broker, set_as_current=False)
    app.conf.update(broker_heartbeat=60, **conf)
    handler = IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=60,
                                 heartbeat_interval=5)
    setup(app, handler)
    return app


def names(app: Celery, pool: object = None) -> list[str]:
    return [name for name, _ in find_risks(app, pool)]


def test_the_threads_pool_on_rabbitmq_with_the_reduction_is_a_risk() -> None:
    app = _app("amqp://guest@127.0.0.1//", worker_pool="threads")
    assert check_configuration(app) == [RISK]
    # the pool the worker was started with (``--pool threads`` passes the class) decides
    assert names(_app("amqp://guest@127.0.0.1//"), TaskPool) == [RISK]
    assert names(_app("pyamqp://guest@127.0.0.1//"), "celery.concurrency.thread:TaskPool") == [
        RISK]


def test_no_risk_without_the_threads_pool_the_reduction_or_amqp() -> None:
    assert names(_app("amqp://guest@127.0.0.1//")) == []  # prefork
    assert names(_app("amqp://guest@127.0.0.1//"), "solo") == []
    assert names(_app("amqp://guest@127.0.0.1//", worker_pool="threads",
                      worker_enable_prefetch_count_reduction=False)) == []
    assert names(_app("redis://127.0.0.1:6379/0", worker_pool="threads")) == []
