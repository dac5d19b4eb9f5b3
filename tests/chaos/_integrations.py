"""The integrations as the harness drives them: how to start a worker, publish a delivery,
break the broker connection, and read back what every delivery was answered (the two Celery
ones are in ``_celery.py``)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from tests._services import REDIS_URL

from ._body import OPERATIONS, TENANT, WorkerConfig
from ._faults import RabbitVhost, Workers, rabbitmqctl, wall_clock
from ._harness import Delivery

ACTORS = {"transactional": "chaos_tx", "plain": "chaos_plain"}


class _Sent:
    """Deliveries published so far, their ids and wall-clock publish times (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Delivery, str]] = []
        self.at: dict[str, str] = {}

    def add(self, delivery: Delivery, delivery_id: str) -> None:
        with self._lock:
            self._items.append((delivery, delivery_id))
            self.at[delivery_id] = wall_clock()

    def items(self) -> list[tuple[Delivery, str]]:
        with self._lock:
            return list(self._items)


class BaseIntegration:
    """What every integration shares: the deliveries sent, and nothing to add by default."""

    def __init__(self) -> None:
        self._sent = _Sent()
        self._answers: dict[str, list[Any]] = {}

    def flush(self) -> None:
        return None

    def sent(self) -> list[tuple[Delivery, str]]:
        return self._sent.items()

    def published_at(self, delivery_id: str) -> str:
        return self._sent.at.get(delivery_id, "?")

    def diagnose(self) -> str:
        return ""

    def figures(self, workdir: Path) -> dict[str, Any]:
        return {}

    def resend_lost(self, workdir: Path) -> int:
        return 0


class RabbitIntegration(BaseIntegration):
    """What the RabbitMQ integrations share: the run's vhost and a broker fault that closes
    every connection of the vhost."""

    def __init__(self, vhost: RabbitVhost) -> None:
        super().__init__()
        self.vhost = vhost

    def broker_fault(self, workers: Workers) -> str:
        return f"{self.vhost.close_connections()} connections closed"

    def diagnose(self) -> str:
        return rabbitmqctl("list_queues", "-p", self.vhost.name, "name", "messages_ready",
                           "messages_unacknowledged")


class DramatiqIntegration(RabbitIntegration):
    """Dramatiq on RabbitMQ (1 process x 4 threads per worker); each delivery's result is
    read back through Dramatiq's ``Results`` (Redis, a namespace per run)."""

    name = "dramatiq"
    stop_seconds = 4.5

    def __init__(self, vhost: RabbitVhost, run_id: str) -> None:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
        from dramatiq.results.backends import RedisBackend

        super().__init__(vhost)
        self.queue = f"chaos_{run_id}"
        self.namespace = f"chaos-{run_id}-results"
        # Publisher confirms: without them an enqueue that returned can still be dropped by a
        # connection the broker is closing (the run's broker faults do exactly that).
        self.broker = RabbitmqBroker(url=vhost.url(), middleware=[], confirm_delivery=True)
        self.broker.declare_queue(self.queue)
        self.backend = RedisBackend(url=REDIS_URL, namespace=self.namespace)
        self._messages: dict[str, Any] = {}

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "dramatiq", "tests.chaos.dramatiq_app",
                "--processes", "1", "--threads", "4"]

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        return replace(base, broker_url=self.vhost.url(), queue=self.queue,
                       result_url=REDIS_URL, result_namespace=self.namespace)

    def publish(self, delivery: Delivery) -> None:
        import dramatiq

        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.queue, actor_name=ACTORS[delivery.profile], args=(delivery.key,),
            kwargs={}, options={"idempotency_key": delivery.key, "tenant": TENANT},
        )
        self.broker.enqueue(message)
        self._messages[message.message_id] = message
        self._sent.add(delivery, message.message_id)

    def results(self) -> dict[str, list[Any]]:
        from dramatiq.results import ResultMissing

        for _, message_id in self._sent.items():
            if message_id in self._answers:
                continue
            with contextlib.suppress(ResultMissing):
                value = self.backend.get_result(self._messages[message_id], block=False)
                self._answers[message_id] = [value]
        return self._answers

    def close(self) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            for _, message_id in self._sent.items():
                client.delete(self.backend.build_message_key(self._messages[message_id]))
        finally:
            client.close()
        self.broker.close()



class DramatiqStepsIntegration(DramatiqIntegration):
    """Dramatiq, its plain ledger body written as a recorded step whose insert is keyed by
    ``ctx.derived_key`` downstream (``plain_steps``): the plain profile's doubles must be 0."""

    name = "dramatiq-steps"

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        return replace(super().worker_config(base), plain_steps=True)

class KafkaIntegration(BaseIntegration):
    """The Kafka consumer loop on Tansu: one topic and group per ledger profile; each
    delivery's outcome comes from the loops' ``on_outcome`` (JSON lines per process)."""

    name = "kafka"
    stop_seconds = 4.5  # below the session timeout: leases expire, partitions stay
    session_ms = 6000
    partitions = 4

    def __init__(self, bootstrap: str, run_id: str, workdir: Path) -> None:
        from confluent_kafka import Producer

        from tests.consumers.conftest import create_topic

        self.bootstrap = bootstrap
        self.topics = {p: create_topic(bootstrap, self.partitions, f"chaos-{p[:2]}")
                       for p in OPERATIONS}
        self.groups = {p: f"chaos-{run_id}-{p}" for p in OPERATIONS}
        self.outcomes = workdir / "outcomes"
        self.outcomes.mkdir()
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        super().__init__()
        self._failed: list[str] = []

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "tests.chaos.kafka_worker"]

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        kafka = {"bootstrap.servers": self.bootstrap, "session.timeout.ms": self.session_ms,
                 "heartbeat.interval.ms": 500}
        return replace(base, kafka=kafka, topics=self.topics, groups=self.groups,
                       outcomes_dir=str(self.outcomes))

    def publish(self, delivery: Delivery) -> None:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self._failed.append(str(err))
                return
            self._sent.add(delivery, f"{msg.topic()}:{msg.partition()}:{msg.offset()}")

        self.producer.produce(
            self.topics[delivery.profile], key=delivery.key.encode(),
            value=json.dumps({"key": delivery.key}).encode(),
            headers=[("idempotency-key", delivery.key.encode())], on_delivery=delivered,
        )
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0, "messages left unsent"
        assert not self._failed, f"produce failed: {self._failed[:5]}"

    def broker_fault(self, workers: Workers) -> str:
        """Kafka's connection fault: a consumer frozen past its session timeout is evicted
        from the group; its partitions (and in-flight messages) go to the others."""
        pid = workers.stop_random(self.session_ms / 1000 + 3)
        return f"pid {pid} stopped past the session timeout"

    def results(self) -> dict[str, list[Any]]:
        answers: dict[str, list[Any]] = {}
        for path in self.outcomes.glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    o = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by SIGKILL; its message was not committed
                answers.setdefault(f"{o['topic']}:{o['partition']}:{o['offset']}", []).append(
                    o["result"]
                )
        return answers

    def close(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        with contextlib.suppress(Exception):
            for future in admin.delete_topics(list(self.topics.values())).values():
                future.result(15)


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]
