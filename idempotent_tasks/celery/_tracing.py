"""The messaging semantic-convention attributes of a Celery delivery, for the span of its
decision (``idempotency <task name>``, a child of the ``run/<task name>`` span of
OpenTelemetry's Celery instrumentation when that is installed).

``messaging.system`` comes from the broker's transport (``rabbitmq`` for AMQP, ``redis``,
else the transport's own name), ``messaging.destination.name`` is the routing key the
message came with (the queue, with the default exchange), ``messaging.message.id`` the task
id.  Built only while tracing is on.
"""

from __future__ import annotations

import functools
from typing import Any

_SYSTEMS = {
    "amqp": "rabbitmq", "amqps": "rabbitmq", "pyamqp": "rabbitmq", "librabbitmq": "rabbitmq",
    "redis": "redis", "rediss": "redis", "sentinel": "redis", "sqs": "aws_sqs",
}


def delivery_attributes(task: Any) -> dict[str, Any]:
    """The attributes of the delivery ``task`` is running."""
    request = task.request
    info = getattr(request, "delivery_info", None) or {}
    attributes = {
        "messaging.system": broker_system(task.app),
        "messaging.operation.type": "process",
        "messaging.destination.name": info.get("routing_key") or None,
        "messaging.message.id": getattr(request, "id", None),
    }
    return {k: v for k, v in attributes.items() if v is not None}


@functools.lru_cache(maxsize=32)  # one per app: its broker does not change
def broker_system(app: Any) -> str | None:
    """``messaging.system`` for the app's broker; ``None`` in eager mode or for a broker
    whose transport cannot be named."""
    if getattr(app.conf, "task_always_eager", False):
        return None
    try:
        transport = app.connection_for_read().transport_cls
    except Exception:  # an unusable broker URL: the task says so itself, not the span
        return None
    if not isinstance(transport, str):
        transport = getattr(transport, "driver_type", None) or type(transport).__name__
    name = str(transport).lower()
    return _SYSTEMS.get(name, name)


__all__ = ["broker_system", "delivery_attributes"]
