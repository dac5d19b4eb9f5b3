"""Run the payment saga end to end: a Celery worker, the shipping consumer on Kafka and an
outbox relay, in this process; every charge is sent twice (a producer retry), and the relay
publishes everything twice too (as a relay killed between the broker's confirm and its mark
would) — and every order is charged, shipped and marked once.

    python examples/payment_saga/run.py --broker amqp://guest:guest@127.0.0.1:5672// \\
        --kafka 127.0.0.1:9092 [--store postgresql+psycopg://postgres@127.0.0.1/test]

Exits 0 and prints ``charged=N shipped=N marked=N`` when each step happened exactly once per
order.  It works in tables of its own (``saga_<hex>_*``) and drops them at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", required=True, help="Celery broker URL (RabbitMQ)")
    parser.add_argument("--kafka", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--store", default=None, help="SQLStore URL (default: a SQLite file)")
    parser.add_argument("--orders", type=int, default=20)
    args = parser.parse_args(argv)
    run = uuid.uuid4().hex[:8]
    os.environ.update(SAGA_BROKER=args.broker, SAGA_KAFKA=args.kafka, SAGA_PREFIX=f"saga_{run}",
                      SAGA_TOPIC=f"saga-{run}", SAGA_STORE=args.store or
                      f"sqlite:///{Path(tempfile.mkdtemp()) / 'saga.db'}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import saga

    saga.create_tables()
    try:
        return _run(saga, args.kafka, args.orders)
    finally:
        saga.drop_tables()


def _run(saga: Any, kafka: str, n: int) -> int:
    from celery.contrib.testing.worker import start_worker

    from idempotent_tasks.consumers.kafka import KafkaConsumerLoop
    from idempotent_tasks.outbox import CeleryPublisher, KafkaPublisher, Outbox, OutboxRelay

    _create_topic(kafka, saga.TOPIC)
    stop = threading.Event()
    loop = KafkaConsumerLoop(saga.shipping, {"bootstrap.servers": kafka, "group.id": saga.TOPIC,
                                             "session.timeout.ms": 6000}, topics=[saga.TOPIC],
                             maintenance=False)
    consumer = threading.Thread(target=loop.run, args=(saga.reserve_shipment,),
                                kwargs={"stop": stop}, daemon=True)
    consumer.start()
    relay = OutboxRelay(saga.handler, Outbox(saga.store),
                        [CeleryPublisher(saga.app), KafkaPublisher({"bootstrap.servers": kafka})],
                        poll_interval=0.2)
    saga.app.conf.broker_heartbeat = 0  # the in-process worker then stops in about a second
    with start_worker(saga.app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30):
        for _copy in range(2):  # the producer sends every charge twice
            for i in range(n):
                saga.charge.apply_async((f"o-{i}", 100), idempotency_key=f"charge-o-{i}",
                                        tenant="shop")
        relay.start()
        republished = _wait(saga, relay, n)
    stop.set()
    consumer.join(30)
    relay.stop()
    got = saga.counts()
    print(f"charged={got['ledger']} shipped={got['shipments']} marked={got['orders']} "
          f"republished={republished}")
    return 0 if got == {"ledger": n, "shipments": n, "orders": n} else 1


def _wait(saga: Any, relay: Any, n: int, timeout: float = 120.0) -> int:
    """Until every order is marked; meanwhile publish every SENT row once more (what a relay
    killed before its mark would do).  Returns how many rows were published twice."""
    deadline = time.monotonic() + timeout
    again: set[int] = set()
    while time.monotonic() < deadline:
        for row in relay.outbox.rows(status="SENT", limit=10_000):
            if row.id not in again:
                again.add(row.id)
                relay.publishers[row.kind].publish([row])
        if saga.counts()["orders"] >= n and len(again) >= 2 * n:
            return len(again)
        time.sleep(0.2)
    return len(again)


def _create_topic(kafka: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        future.result(15)


if __name__ == "__main__":
    raise SystemExit(main())
