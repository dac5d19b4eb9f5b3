"""The OpenTelemetry messaging semantic-convention attributes of one :class:`Message`, for the
span of its decision (``idempotency <operation>``).

The loops say which system they consume (``messaging.system``, and Kafka's consumer group)
around the consumer's call; the consumer adds what the message itself tells: destination,
partition, message id, Kafka offset and key, RabbitMQ routing key and delivery tag.  A Kafka
message has no id of its own: ``messaging.message.id`` is ``<topic>.<partition>.<offset>``,
as OpenTelemetry's confluent-kafka instrumentation writes it.  Built only while tracing is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._core import tracing
from ._message import Message


def message_attributes(message: Message, system: str | None = None) -> dict[str, Any]:
    """The attributes of ``message`` (``system``: the loop's, from the enclosing block, when
    not given)."""
    if system is None:
        system = tracing.current_attributes().get("messaging.system")
    attributes: dict[str, Any] = {
        "messaging.system": system,
        "messaging.operation.type": "process",
        "messaging.destination.name": message.topic,
        "messaging.message.id": message.message_id,
    }
    key = _text(message.key)
    if system == "kafka":
        if message.partition is not None:
            attributes["messaging.destination.partition.id"] = str(message.partition)
        if message.offset is not None:
            attributes["messaging.kafka.offset"] = message.offset
            if message.partition is not None and message.message_id is None:
                attributes["messaging.message.id"] = (
                    f"{message.topic}.{message.partition}.{message.offset}"
                )
        attributes["messaging.kafka.message.key"] = key
    elif system == "rabbitmq":
        attributes["messaging.rabbitmq.destination.routing_key"] = key
        attributes["messaging.rabbitmq.message.delivery_tag"] = message.offset
    return {k: v for k, v in attributes.items() if v is not None}


def loop_attributes(system: str, group: Any = None) -> Callable[[], dict[str, Any]]:
    """What a loop adds to each decision's span: its system (and Kafka's consumer group)."""
    return lambda: {"messaging.system": system, "messaging.consumer.group.name": group}


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


__all__ = ["loop_attributes", "message_attributes"]
