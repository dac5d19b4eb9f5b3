"""taskiq integration: exactly-once execution per (tenant, operation, key) for tasks.

.. code-block:: python

    broker = AioPikaBroker(url).with_middlewares(IdempotencyMiddleware(handler))

    @idempotent(broker, permanent=(InvalidOrder,), max_retries=3)
    async def charge(order_id: str, amount: int) -> dict: ...

    await charge.kicker().with_labels(**idempotency_labels(key, tenant="acme")).kiq("o-1", 100)
    await enqueue_unique(report, 7, key="report-7", tenant="acme")  # not while one is pending

The wrapper :func:`idempotent` registers runs the body through
:meth:`IdempotencyHandler.run_async` on the worker's event loop; the
:class:`IdempotencyMiddleware` hands it each message (``pre_execute``) and maps the outcome
(``on_error`` / ``post_execute``): results and replays are the task's result, in-progress /
failed / store-down messages are sent again after a backoff, poisoned and refused ones fail
for good (docs/taskiq.md).  Works with any taskiq broker; tested with a real worker process
on ``taskiq-redis`` (Redis Streams) and ``taskiq-aio-pika`` (RabbitMQ).
"""

from __future__ import annotations

try:
    import taskiq  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise ImportError(
        "idempotent_tasks.taskiq needs taskiq: pip install 'idempotent-tasks[taskiq]'"
    ) from exc

from ._delivery import IdempotencyRetry
from ._middleware import IdempotencyMiddleware
from ._spec import KEY_LABEL, OUTCOME_LABEL, TENANT_LABEL, idempotency_labels
from ._task import idempotent
from ._unique import enqueue_unique

__all__ = [
    "KEY_LABEL",
    "OUTCOME_LABEL",
    "TENANT_LABEL",
    "IdempotencyMiddleware",
    "IdempotencyRetry",
    "enqueue_unique",
    "idempotency_labels",
    "idempotent",
]
