"""The three integrations as the harness drives them: how to start a worker, publish a
delivery, break the broker connection, and read back what every delivery was answered."""

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
from ._faults import RabbitVhost, Workers
from ._harness import Delivery

ACTORS = {"transactional": "chaos_tx", "plain": "chaos_plain"}


class _Sent:
    """Deliveries published so far and their ids (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Delivery, str]] = []

    def add(self, delivery: Delivery, delivery_id: str) -> None:
        with self._lock:
            self._items.append((delivery, delivery_id))

    def items(self) -> list[tuple[Delivery, str]]:
        with self._lock:
            return list(self._items)


class _RabbitIntegration:
    """What the two RabbitMQ integrations share: the run's vhost, the deliveries sent, and a
    broker fault that closes every connection of the vhost."""

    def __init__(self, vhost: RabbitVhost) -> None:
        self.vhost = vhost
        self._sent = _Sent()
        self._answers: dict[str, list[Any]] = {}

    def flush(self) -> None:
        return None

    def broker_fault(self, workers: Workers) -> None:
        self.vhost.close_connections()

    def sent(self) -> list[tuple[Delivery, str]]:
        return self._sent.items()


class CeleryIntegration(_RabbitIntegration):
    """Celery on RabbitMQ (threads pool, 4 threads per worker); each delivery is a task
    message of its own, and its result (fresh or replayed) is read from the Redis result
    backend."""

    name = "celery"
    stop_seconds = 4.5  # longer than the 3 s lease: duplicates elsewhere take over

    def __init__(self, vhost: RabbitVhost, run_id: str) -> None:
        from celery import Celery

        super().__init__(vhost)
        self.queue = f"chaos-{run_id}"
        self.app = Celery("chaos-producer", broker=vhost.url(), set_as_current=False)
        self.app.conf.update(task_default_queue=self.queue, broker_connection_retry_on_startup=True)
        self._redis = redis.Redis.from_url(REDIS_URL)

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "tests.chaos.celery_app", "worker",
                "--pool", "threads", "--concurrency", "4", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
                "-Q", self.queue]

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        return replace(base, broker_url=self.vhost.url(), queue=self.queue, result_url=REDIS_URL)

    def publish(self, delivery: Delivery) -> None:
        result = self.app.send_task(
            OPERATIONS[delivery.profile], args=(delivery.key,), queue=self.queue,
            headers={"idempotency_key": delivery.key, "idempotency_tenant": TENANT},
        )
        self._sent.add(delivery, result.id)

    def results(self) -> dict[str, list[Any]]:
        pending = [i for _, i in self._sent.items() if i not in self._answers]
        for start in range(0, len(pending), 500):
            chunk = pending[start:start + 500]
            values = self._redis.mget([f"celery-task-meta-{i}" for i in chunk])
            for task_id, raw in zip(chunk, values, strict=True):
                meta = json.loads(raw) if raw else {}
                if meta.get("status") == "SUCCESS":
                    self._answers[task_id] = [meta["result"]]
        return self._answers

    def close(self) -> None:
        ids = [f"celery-task-meta-{i}" for _, i in self._sent.items()]
        for start in range(0, len(ids), 1000):
            self._redis.delete(*ids[start:start + 1000])
        self._redis.close()
        self.app.close()


class DramatiqIntegration(_RabbitIntegration):
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
        self.broker = RabbitmqBroker(url=vhost.url(), middleware=[])
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


class KafkaIntegration:
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
        self._sent = _Sent()
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

    def broker_fault(self, workers: Workers) -> None:
        """Kafka's connection fault: a consumer frozen past its session timeout is evicted
        from the group; its partitions (and in-flight messages) go to the others."""
        workers.stop_random(self.session_ms / 1000 + 3)

    def sent(self) -> list[tuple[Delivery, str]]:
        return self._sent.items()

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
