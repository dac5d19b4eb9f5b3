"""The Celery / Dramatiq integration layer's own CPU, counted under callgrind.

``python _integration_cpu_probe.py FRAMEWORK VARIANT MODE N [WARMUP]``: ``FRAMEWORK`` is
``celery`` or ``dramatiq``; ``VARIANT`` ``layer`` (an idempotent task / actor, through
``IdempotentTask.__call__`` or the ``IdempotencyMiddleware``) or ``execute`` (a plain task /
actor whose body calls ``handler.execute`` with the same scope, payload and body: the
floor the layer is measured against); ``MODE`` ``first`` (a fresh key each) or ``replay``
(one key that already succeeded).  Both variants use ``IdempotencyHandler(MemoryStore(),
metrics=None)`` and run each delivery the way the worker does, in process, with no broker:

* Celery: ``celery.app.trace.build_tracer`` (the worker's tracer: the request context,
  ``task_prerun`` / ``task_postrun`` when they have receivers) on a request dict carrying
  the ``idempotency_key`` / ``idempotency_tenant`` headers as a worker's request does;
* Dramatiq: the body of ``dramatiq.worker._WorkerThread.process_message`` (the broker's
  ``before`` / ``after`` hooks, the actor call, ``SkipMessage``, then the ack's hooks) on
  a ``StubBroker`` with its default middleware, ``IdempotencyMiddleware`` added for
  ``layer``.

Run with two values of ``N`` under ``valgrind --tool=callgrind`` and ``PYTHONHASHSEED=0``:
the difference of the totals over the difference of ``N`` is one delivery, and ``layer``
minus ``execute`` is what the integration adds per task.  The cyclic garbage collector is
off while the deliveries are counted (see ``main``).  Standalone (imports nothing from
``benchmarks``); ``python -m benchmarks.integration_cpu`` runs the whole table.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

TENANT = "t"


def body() -> dict[str, bool]:
    return {"ok": True}


def celery_runner(variant: str) -> Callable[[str, str], Any]:
    from celery import Celery
    from celery.app.trace import build_tracer

    from idempotent_tasks import IdempotencyHandler, MemoryStore

    app = Celery("probe", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    if variant == "layer":
        from idempotent_tasks.celery import IdempotentTask, setup

        setup(app, handler, beat=False)

        @app.task(base=IdempotentTask, name="probe.task", shared=False)  # type: ignore[misc]
        def task(i: int) -> dict[str, bool]:
            return body()
    else:
        @app.task(name="probe.task", shared=False, acks_late=True, bind=True)  # type: ignore[misc]
        def task(self: Any, i: int) -> Any:
            key = self.request.idempotency_key  # what the worker's request carries
            return handler.execute(body, operation="probe.task", tenant=TENANT, key=key,
                            payload={"args": [i], "kwargs": {}})

    app.finalize()
    task = app.tasks["probe.task"]  # the task itself, as the worker has it (not a proxy)
    trace = build_tracer(task.name, task, app=app, eager=False)
    delivery_info = {"exchange": "", "routing_key": "celery", "priority": 0,
                     "redelivered": False}

    def deliver(task_id: str, key: str) -> Any:
        request = {"id": task_id, "task": task.name, "idempotency_key": key,
                   "idempotency_tenant": TENANT, "delivery_info": delivery_info,
                   "ignore_result": True}
        return trace(task_id, (1,), {}, request)

    return deliver


def dramatiq_runner(variant: str) -> Callable[[str, str], Any]:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import SkipMessage

    from idempotent_tasks import IdempotencyHandler, MemoryStore

    broker = StubBroker()
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    if variant == "layer":
        from idempotent_tasks.dramatiq import IdempotencyMiddleware

        middleware = IdempotencyMiddleware(handler, maintenance=False)
        broker.add_middleware(middleware)
        middleware.before_worker_boot(broker, None)

        @dramatiq.actor(broker=broker, actor_name="probe_actor", idempotent=True)
        def actor(i: int) -> None:
            body()
    else:
        current: dict[str, Any] = {}

        @dramatiq.actor(broker=broker, actor_name="probe_actor")
        def actor(i: int) -> None:
            handler.execute(body, operation="probe_actor", tenant=TENANT,
                            key=current["message"].options["idempotency_key"],
                            payload={"args": [i], "kwargs": {}})

    broker.declare_queue("default")
    logger = logging.getLogger("dramatiq.worker.WorkerThread")

    def deliver(message_id: str, key: str) -> None:
        message = dramatiq.MessageProxy(dramatiq.Message(
            queue_name="default", actor_name="probe_actor", args=(1,), kwargs={},
            options={"idempotency_key": key, "tenant": TENANT}, message_id=message_id,
            message_timestamp=0,
        ))
        if variant != "layer":
            current["message"] = message
        try:  # dramatiq.worker._WorkerThread.process_message, minus the consumer
            broker.emit_before("process_message", message)
            res = actor(*message.args, **message.kwargs)
            broker.emit_after("process_message", message, result=res)
        except SkipMessage:
            logger.warning("Message %s was skipped.", message)
            broker.emit_after("skip_message", message)
        broker.emit_before("ack", message)
        broker.emit_after("ack", message)
        message.clear_exception()

    return deliver


def main(argv: list[str]) -> None:
    framework, variant, mode, n = argv[0], argv[1], argv[2], int(argv[3])
    warmup = int(argv[4]) if len(argv) > 4 else 200
    import idempotent_tasks

    deliver = {"celery": celery_runner, "dramatiq": dramatiq_runner}[framework](variant)
    for i in range(warmup):
        deliver(f"w-{i}", f"warm-{i}")
    # No cyclic collection while counting: a full one walks the whole heap (the store's
    # records grow with N), and whether one falls between the N runs would decide the slope.
    gc.collect()
    gc.disable()
    if mode == "first":
        for i in range(n):
            deliver(f"m-{i}", f"k-{i}")
    elif mode == "replay":
        deliver("done", "done")
        for i in range(n):
            deliver(f"m-{i}", "done")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"package: {idempotent_tasks.__file__}")


if __name__ == "__main__":
    main(sys.argv[1:])
