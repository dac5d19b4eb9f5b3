"""FastStream integration: exactly-once effects per (tenant, operation, key) for subscribers.

.. code-block:: python

    idempotency = IdempotencyMiddleware(handler, dead_letter="orders.dead")
    broker = RabbitBroker(url, middlewares=[idempotency])

    @broker.subscriber("orders")
    async def charge(order: Order) -> Receipt: ...        # runs once per idempotency key

    # or one subscriber at a time:
    @broker.subscriber("orders")
    @idempotent(handler, operation="orders.charge", permanent=(InvalidOrder,))
    async def charge(order: Order) -> Receipt: ...

Both give a subscriber the consumers' semantics (docs/consumers.md) on FastStream's own
extension points — key from the ``idempotency-key`` header or the CloudEvents id, tenant from
the ``idempotency-tenant`` header or ``default_tenant``, payload = the decoded body — and map
the engine's outcome through the one table: settled kinds are acked, poisoned and refused
messages are dead-lettered, in-progress / failed / store-down messages come back later
(docs/faststream.md has the per-broker details: RabbitMQ, NATS JetStream, Redis Streams,
Kafka).  The body runs through :meth:`IdempotencyHandler.run_async` on FastStream's event
loop: with an async store no store call leaves the loop.
"""

from __future__ import annotations

try:
    import faststream  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise ImportError(
        "idempotent_tasks.faststream needs FastStream: pip install 'idempotent-tasks[faststream]'"
    ) from exc

from ._decorator import idempotent
from ._delivery import IdempotencyDecision
from ._middleware import IdempotencyMiddleware

__all__ = ["IdempotencyDecision", "IdempotencyMiddleware", "idempotent"]
