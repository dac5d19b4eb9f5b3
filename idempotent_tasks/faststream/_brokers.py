"""What differs between FastStream's brokers: how a delivery is seen, retried and dead-lettered.

One :class:`Broker` per FastStream broker package, chosen by the class of the
``StreamMessage`` (nothing is imported from a broker package, so each extra stays optional).
Per broker: the ``Message`` coordinates; how a message *comes back later*; and what a dead
letter with no ``dead_letter`` destination becomes.

* **RabbitMQ**: queue, delivery tag, AMQP message id; held for the backoff, then
  ``nack(requeue=True)``; ``reject(requeue=False)`` (the queue's own dead-letter exchange).
* **NATS JetStream**: subject, stream sequence, ``Nats-Msg-Id``; ``nak(delay=backoff)`` (the
  server redelivers after the delay); ``term()`` (never redelivered).
* **Redis Streams**: stream, entry id; left pending (no ``XACK``) until a reclaiming
  subscriber (``StreamSub(min_idle_time=...)``) claims it after its idle time; ``XACK``.
* **Kafka** (aiokafka, confluent): topic, partition, offset, key; held for the backoff, then
  FastStream's ``nack`` (seek back to the message); commit.

Holding (RabbitMQ, Kafka) happens inside the delivery's own processing: on RabbitMQ every
delivery is its own task, so a held message costs one prefetch slot and blocks nothing else;
a FastStream Kafka subscriber processes its partitions in order, so the wait also keeps the
partition's order (and holds back that subscriber's other partitions for the backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from ..consumers._message import Message, header_text


class Broker:
    """The default: what every ``StreamMessage`` offers (``ack``/``nack``/``reject``)."""

    name = "generic"

    def message(self, msg: Any, subscriber: Any) -> Message:
        return Message(
            msg.body, _headers(msg.headers), message_id=msg.message_id,
            content_type=msg.content_type or None,
        )

    async def retry(self, msg: Any, delay: float) -> None:
        await asyncio.sleep(delay)
        await msg.nack()

    async def drop(self, msg: Any) -> None:
        """A dead letter with nowhere to go: settle it so that it never loops."""
        await msg.ack()

    async def publish(
        self, broker: Any, msg: Any, destination: str, headers: dict[str, Any],
        options: Mapping[str, Any],
    ) -> None:
        await broker.publish(msg.body, destination, headers=headers, **options)


class Rabbit(Broker):
    name = "rabbit"

    def message(self, msg: Any, subscriber: Any) -> Message:
        raw = msg.raw_message
        queue = getattr(getattr(subscriber, "queue", None), "name", None) or raw.routing_key
        return Message(
            msg.body, _headers(msg.headers), key=raw.routing_key, topic=queue,
            offset=raw.delivery_tag, message_id=raw.message_id,
            content_type=msg.content_type or None,
        )

    async def retry(self, msg: Any, delay: float) -> None:
        await asyncio.sleep(delay)
        await msg.nack(requeue=True)

    async def drop(self, msg: Any) -> None:
        await msg.reject(requeue=False)

    async def publish(
        self, broker: Any, msg: Any, destination: str, headers: dict[str, Any],
        options: Mapping[str, Any],
    ) -> None:
        raw = msg.raw_message
        publish_options: dict[str, Any] = {
            "persist": True, "content_type": raw.content_type,
            "content_encoding": raw.content_encoding, "message_id": raw.message_id,
            "correlation_id": raw.correlation_id, **options,
        }
        await broker.publish(msg.body, queue=destination, headers=headers, **publish_options)


class Nats(Broker):
    name = "nats"

    def message(self, msg: Any, subscriber: Any) -> Message:
        raw = msg.raw_message
        headers = _headers(msg.headers)
        sequence = None
        with contextlib.suppress(Exception):  # a core NATS message has no JetStream metadata
            sequence = raw.metadata.sequence.stream
        return Message(
            msg.body, headers, topic=raw.subject, offset=sequence,
            message_id=_first(headers, "Nats-Msg-Id", "message_id"),
            content_type=msg.content_type or None,
        )

    async def retry(self, msg: Any, delay: float) -> None:
        await msg.nack(delay=delay)

    async def drop(self, msg: Any) -> None:
        await msg.reject()


class RedisStream(Broker):
    name = "redis"

    def message(self, msg: Any, subscriber: Any) -> Message:
        raw = msg.raw_message
        ids = raw.get("message_ids") or []
        entry = ids[0].decode() if ids and isinstance(ids[0], bytes) else None
        return Message(
            msg.body, _headers(msg.headers), topic=raw.get("channel"), message_id=entry,
            content_type=msg.content_type or None,
        )

    async def retry(self, msg: Any, delay: float) -> None:
        await msg.nack()  # no XACK: the entry stays pending until a reclaimer claims it

    async def publish(
        self, broker: Any, msg: Any, destination: str, headers: dict[str, Any],
        options: Mapping[str, Any],
    ) -> None:
        await broker.publish(msg.body, stream=destination, headers=headers, **options)


class Kafka(Broker):
    name = "kafka"

    def message(self, msg: Any, subscriber: Any) -> Message:
        raw = msg.raw_message
        return Message(
            msg.body, _headers(msg.headers), key=raw.key, topic=raw.topic,
            partition=raw.partition, offset=raw.offset, content_type=msg.content_type or None,
        )

    async def publish(
        self, broker: Any, msg: Any, destination: str, headers: dict[str, Any],
        options: Mapping[str, Any],
    ) -> None:
        await broker.publish(
            msg.body, destination, key=msg.raw_message.key, headers=headers, **options
        )


class Confluent(Kafka):
    name = "confluent"

    def message(self, msg: Any, subscriber: Any) -> Message:
        raw = msg.raw_message
        return Message(
            msg.body, _headers(msg.headers), key=raw.key(), topic=raw.topic(),
            partition=raw.partition(), offset=raw.offset(),
            content_type=msg.content_type or None,
        )

    async def publish(
        self, broker: Any, msg: Any, destination: str, headers: dict[str, Any],
        options: Mapping[str, Any],
    ) -> None:
        await broker.publish(
            msg.body, destination, key=msg.raw_message.key(), headers=headers, **options
        )


_BY_PACKAGE: dict[str, type[Broker]] = {
    "faststream.rabbit": Rabbit,
    "faststream.nats": Nats,
    "faststream.redis": RedisStream,
    "faststream.kafka": Kafka,
    "faststream.confluent": Confluent,
}


#: The adapter of each ``StreamMessage`` class seen (adapters hold no state).
_ADAPTERS: dict[type, Broker] = {}


def broker_for(msg: Any) -> Broker:
    """The adapter for a delivery, from the package of its ``StreamMessage`` class."""
    cls = type(msg)
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        module = cls.__module__
        adapter = next(
            (make() for package, make in _BY_PACKAGE.items()
             if module == package or module.startswith(package + ".")),
            None,
        ) or Broker()
        _ADAPTERS[cls] = adapter
    return adapter


def _headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(k): header_text(v) for k, v in (headers or {}).items()}


def _first(headers: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = headers.get(name)
        if isinstance(value, str) and value:
            return value
    return None


__all__ = ["Broker", "broker_for"]
