"""Real brokers for the FastStream tests: a RabbitMQ vhost of the session, the machine's NATS
JetStream, Redis, and a Tansu (Kafka-protocol) broker spoken to through aiokafka."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from idempotent_tasks import IdempotencyHandler, RedisStore

from .._services import IN_CI, REDIS_URL, private_vhost, reachable, require
from ..consumers.conftest import kafka_bootstrap  # noqa: F401  (the session's Tansu broker)
from ._kits import ConfluentKit, KafkaKit, Kit, NatsKit, RabbitKit, RedisKit

BROKERS = ["rabbit", "nats", "redis", "kafka", "confluent"]


def require_nats() -> None:
    if reachable(4222):
        return
    message = "NATS (JetStream) is not reachable on 127.0.0.1:4222"
    if IN_CI:
        pytest.fail(message + " (CI=true: service-backed tests never skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def rabbit_vhost_url() -> Iterator[str]:
    """An AMQP URL on a vhost of our own, deleted (with its queues) after the session."""
    with private_vhost("faststream") as url:
        yield url


@pytest.fixture(params=BROKERS)
def kit(request: pytest.FixtureRequest) -> Kit:
    return make_kit(request.param, request)


#: The brokers whose FastStream client is asyncio all the way down (FastStream's confluent
#: broker polls the synchronous confluent-kafka client in a thread of its own).
ASYNCIO_BROKERS = ["rabbit", "nats", "redis", "kafka"]


@pytest.fixture(params=ASYNCIO_BROKERS)
def asyncio_kit(request: pytest.FixtureRequest) -> Kit:
    return make_kit(request.param, request)


def make_kit(name: str, request: pytest.FixtureRequest) -> Kit:
    if name == "rabbit":
        return RabbitKit(request.getfixturevalue("rabbit_vhost_url"))
    if name == "nats":
        require_nats()
        return NatsKit()
    if name == "redis":
        require("redis")
        return RedisKit()
    if name == "confluent":
        return ConfluentKit(request.getfixturevalue("kafka_bootstrap"))
    return KafkaKit(request.getfixturevalue("kafka_bootstrap"))


@pytest.fixture
def store() -> Iterator[RedisStore]:
    require("redis")
    store = RedisStore(REDIS_URL, prefix=f"it_fs_{uuid.uuid4().hex[:10]}")
    store.create_schema()
    try:
        yield store
    finally:
        store.drop_schema()
        store.close()


@pytest.fixture
def handler(store: RedisStore) -> IdempotencyHandler:
    return IdempotencyHandler(store, lease_timeout=5, max_retries=3, metrics=None)
