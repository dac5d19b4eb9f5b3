"""One test body, four real brokers: what differs between them, for the FastStream tests.

Each kit builds a FastStream broker on its own destinations (a RabbitMQ vhost of the session,
NATS streams, Redis stream keys and Kafka topics with unique names), registers the subscriber
under test, publishes, and collects dead letters with a plain subscriber.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fast_depends.library import CustomField
from faststream import AckPolicy


class _Message(CustomField):
    """The delivery's ``StreamMessage``, resolved on the loop (FastStream's own
    ``Context("message")`` is resolved in a worker thread by fast_depends)."""

    def __init__(self) -> None:
        super().__init__(cast=False, required=True)

    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        kwargs[self.param_name or "msg"] = kwargs["context__"].get_local("message")
        return kwargs


MESSAGE = _Message()


async def raw_body(msg: Any) -> Any:
    """A decoder that leaves the body as bytes (dead letters may carry invalid JSON)."""
    return msg.body


@dataclass
class Dead:
    """Dead letters seen on a destination: (body, headers)."""

    items: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, count: int = 1, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.items) < count:
                self.arrived.clear()
                await self.arrived.wait()


class Kit:
    name = ""
    dead_letter_options: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:10]

    def destination(self, suffix: str = "in") -> str:
        return f"it-{self.tag}-{suffix}"

    def broker(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def router(self, **kwargs: Any) -> Any:
        """A router of the kit's broker type (``middlewares=`` scoped to its subscribers)."""
        raise NotImplementedError

    def subscribe(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        """Register ``fn`` (already made idempotent, or behind a router's middleware)."""
        raise NotImplementedError

    def collect(self, broker: Any, destination: str) -> Dead:
        dead = Dead()

        async def collector(msg: Any = MESSAGE) -> None:
            dead.items.append((msg.body, dict(msg.headers)))
            dead.arrived.set()

        self._plain(broker, destination, collector)
        return dead

    def _plain(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        raise NotImplementedError

    async def prepare(self, broker: Any, destinations: list[str]) -> None:
        """Declare what must exist before publishing (queues, streams)."""

    async def publish(self, broker: Any, destination: str, body: Any,
                      headers: dict[str, str]) -> None:
        await broker.publish(body, destination, headers=headers)

    async def unsettled(self, destination: str, published: int) -> int:
        """Messages of ``destination`` neither acked nor dead-lettered (the broker closed)."""
        raise NotImplementedError

    async def cleanup(self, broker: Any, destinations: list[str]) -> None:
        """Remove what the test created."""


class RabbitKit(Kit):
    name = "rabbit"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def broker(self, **kwargs: Any) -> Any:
        from faststream.rabbit import RabbitBroker

        return RabbitBroker(self.url, logger=None, graceful_timeout=10, **kwargs)

    def router(self, **kwargs: Any) -> Any:
        from faststream.rabbit import RabbitRouter

        return RabbitRouter(**kwargs)

    def _queue(self, name: str) -> Any:
        from faststream.rabbit import RabbitQueue

        return RabbitQueue(name, durable=True)

    def subscribe(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        broker.subscriber(self._queue(destination))(fn)

    def _plain(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        broker.subscriber(self._queue(destination), decoder=raw_body)(fn)

    async def prepare(self, broker: Any, destinations: list[str]) -> None:
        for name in destinations:
            await broker.declare_queue(self._queue(name))

    async def publish(self, broker: Any, destination: str, body: Any,
                      headers: dict[str, str]) -> None:
        await broker.publish(body, queue=destination, headers=headers, persist=True)

    async def unsettled(self, destination: str, published: int) -> int:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(destination, passive=True)
            count: int = queue.declaration_result.message_count or 0
            return count
        finally:
            await connection.close()
    # the vhost is the session's own: it is deleted with everything in it


class NatsKit(Kit):
    name = "nats"

    def __init__(self) -> None:
        super().__init__()
        self.stream_name = f"IT_{self.tag}"
        self.dead_letter_options = {"stream": self.stream_name}

    def broker(self, **kwargs: Any) -> Any:
        from faststream.nats import NatsBroker

        return NatsBroker("nats://127.0.0.1:4222", logger=None, graceful_timeout=10, **kwargs)

    def router(self, **kwargs: Any) -> Any:
        from faststream.nats import NatsRouter

        return NatsRouter(**kwargs)

    def destination(self, suffix: str = "in") -> str:
        return f"it.{self.tag}.{suffix}"

    def _stream(self) -> Any:
        from faststream.nats import JStream

        return JStream(self.stream_name, subjects=[f"it.{self.tag}.>"])

    def subscribe(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        from faststream.nats import PullSub

        broker.subscriber(destination, stream=self._stream(), pull_sub=PullSub(timeout=0.2),
                          durable=f"d-{destination.replace('.', '-')}")(fn)

    def _plain(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        from faststream.nats import PullSub

        broker.subscriber(destination, stream=self._stream(), pull_sub=PullSub(timeout=0.2),
                          durable=f"d-{destination.replace('.', '-')}", decoder=raw_body)(fn)

    async def publish(self, broker: Any, destination: str, body: Any,
                      headers: dict[str, str]) -> None:
        await broker.publish(body, destination, headers=headers, stream=self.stream_name)

    async def unsettled(self, destination: str, published: int) -> int:
        import nats

        client = await nats.connect("nats://127.0.0.1:4222")
        try:
            info = await client.jetstream().consumer_info(
                self.stream_name, f"d-{destination.replace('.', '-')}")
            return int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        finally:
            await client.close()

    async def cleanup(self, broker: Any, destinations: list[str]) -> None:
        import nats

        client = await nats.connect("nats://127.0.0.1:4222")
        try:
            await client.jetstream().delete_stream(self.stream_name)
        except Exception:
            pass
        finally:
            await client.close()


class RedisKit(Kit):
    name = "redis"

    def broker(self, **kwargs: Any) -> Any:
        from faststream.redis import RedisBroker

        return RedisBroker("redis://127.0.0.1:6379/0", logger=None, graceful_timeout=10, **kwargs)

    def router(self, **kwargs: Any) -> Any:
        from faststream.redis import RedisRouter

        return RedisRouter(**kwargs)

    def subscribe(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        from faststream.redis import StreamSub

        group = f"g-{destination}"
        # the reader of new entries, and the reclaimer of entries left pending (retries)
        broker.subscriber(stream=StreamSub(destination, group=group, consumer="c1"))(fn)
        broker.subscriber(stream=StreamSub(destination, group=group, consumer="c2",
                                           min_idle_time=150, polling_interval=20))(fn)

    def _plain(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        from faststream.redis import StreamSub

        broker.subscriber(stream=StreamSub(destination, group=f"g-{destination}",
                                           consumer="c1"), decoder=raw_body)(fn)

    async def publish(self, broker: Any, destination: str, body: Any,
                      headers: dict[str, str]) -> None:
        await broker.publish(body, stream=destination, headers=headers)

    async def unsettled(self, destination: str, published: int) -> int:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            pending = await client.xpending(destination, f"g-{destination}")
            groups = await client.xinfo_groups(destination)
            lag = sum(int(g.get("lag") or 0) for g in groups)
            return int(pending["pending"]) + lag
        finally:
            await client.aclose()

    async def cleanup(self, broker: Any, destinations: list[str]) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            await client.delete(*destinations)
        finally:
            await client.aclose()


class KafkaKit(Kit):
    name = "kafka"

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.bootstrap = bootstrap

    def broker(self, **kwargs: Any) -> Any:
        from faststream.kafka import KafkaBroker

        return KafkaBroker(self.bootstrap, logger=None, graceful_timeout=10, **kwargs)

    def router(self, **kwargs: Any) -> Any:
        from faststream.kafka import KafkaRouter

        return KafkaRouter(**kwargs)

    def _options(self, destination: str) -> dict[str, Any]:
        return {"group_id": f"g-{destination}", "ack_policy": AckPolicy.ACK,
                "auto_offset_reset": "earliest", "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 500}

    def subscribe(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        broker.subscriber(destination, **self._options(destination))(fn)

    def _plain(self, broker: Any, destination: str, fn: Callable[..., Any]) -> None:
        broker.subscriber(destination, decoder=raw_body, **self._options(destination))(fn)

    async def prepare(self, broker: Any, destinations: list[str]) -> None:
        await asyncio.to_thread(_create_topics, self.bootstrap, destinations)

    async def publish(self, broker: Any, destination: str, body: Any,
                      headers: dict[str, str]) -> None:
        await broker.publish(body, destination, headers=headers)

    async def unsettled(self, destination: str, published: int) -> int:
        return published - await asyncio.to_thread(
            _committed, self.bootstrap, f"g-{destination}", destination)


class ConfluentKit(KafkaKit):
    """The same Tansu broker through FastStream's confluent-kafka broker."""

    name = "confluent"

    def broker(self, **kwargs: Any) -> Any:
        from faststream.confluent import KafkaBroker

        return KafkaBroker(self.bootstrap, logger=None, graceful_timeout=10, **kwargs)

    def router(self, **kwargs: Any) -> Any:
        from faststream.confluent import KafkaRouter

        return KafkaRouter(**kwargs)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "enable.auto.commit": False})
    try:
        (tp,) = probe.committed([TopicPartition(topic, 0)], timeout=10)
        return max(int(tp.offset), 0)
    finally:
        probe.close()


def _create_topics(bootstrap: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, num_partitions=1, replication_factor=1) for name in names]
    ).values():
        future.result(15)
