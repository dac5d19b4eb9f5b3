"""The transactional outbox (docs/outbox.md), on PostgreSQL.

* **Staging cost**: ``current_outbox().send(kafka_record(...))`` inside an open transaction,
  against the floor of one plain ``INSERT`` of a row of the same columns (a table with only
  its primary key) on the same connection through the same DBAPI cursor — interleaved
  batches, medians of paired ratios.  What ``send`` adds on top: the key derivation, the
  JSON of the fields, the ``pg_notify`` in the same statement, the two partial indexes.
  Target: ≤ 1.2x.
* **Relay throughput** to RabbitMQ (publisher confirms per batch) and to Kafka (Tansu,
  idempotent producer, ``acks=all``): ``n`` rows staged beforehand (one per parent, as most
  bodies stage one message), then ``relay.drain()`` until every row is SENT; messages per
  second, and the broker's count checked.  Target: ≥ 5,000 msg/s each.
* **Commit-to-publish latency**: a relay thread (``LISTEN``) running while bodies commit one
  message every few milliseconds; a consumer on the broker stamps each arrival; latency =
  arrival - the moment ``execute_in_transaction`` returned (the commit).  p50 and p99.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from rich.console import Console

from ._services import POSTGRES_URL, RABBITMQ_URL, drop_store
from ._timing import interleave
from .consumers import kafka_broker

STAGE_TARGET = 1.2
THROUGHPUT_TARGET = 5000.0


@contextlib.contextmanager
def _store() -> Iterator[Any]:
    from idempotent_tasks import SQLStore

    prefix = f"bench_ob_{uuid.uuid4().hex[:8]}"
    from idempotent_tasks.outbox import Outbox

    store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    store.create_schema()
    # the outbox's tables are the store's only once the outbox package is imported: when
    # this section runs first in a process, they must be created here
    Outbox(store).create_schema()
    try:
        yield store
    finally:
        drop_store(store, "postgresql", prefix)


# -- staging ----------------------------------------------------------------------------------
def staging(n: int) -> dict[str, Any]:
    """``send`` against one INSERT of the same row into a table of the same definition, on
    the same connection and DBAPI cursor, inside one open transaction (interleaved); and the
    same comparison per body — a transactional body that stages one message (its NOTIFY
    included) against one that INSERTs that row, each minus an empty body."""
    from idempotent_tasks import IdempotencyHandler

    with _store() as store:
        from idempotent_tasks.outbox._schema import _table

        floor = _table(f"{store.table_prefix}_floor", sa.MetaData(), sent=False)
        floor.create(store.engine)
        try:
            handler = IdempotencyHandler(store, metrics=None)
            result = _in_one_transaction(handler, floor, n)
            result.update(_per_body(handler, floor, max(n // 4, 100)))
            return result
        finally:
            floor.drop(store.engine)


def _floor_insert(table: sa.Table) -> str:
    """The same columns and values as the staging statement, as one plain INSERT."""
    from idempotent_tasks.outbox._staging import _COLUMNS

    names = ", ".join([*_COLUMNS, "status", "attempts"])
    values = ", ".join(["%s"] * len(_COLUMNS) + ["'PENDING'", "0"])
    return f'INSERT INTO "{table.name}" ({names}) VALUES ({values})'


def _floor_params(i: int) -> tuple[Any, ...]:
    now = time.time()
    return ("acme", "payments.charge", "k", 1, i, f"{i:064d}", "kafka", "orders",
            b'{"headers":{},"key":null,"partition":null,"topic":"orders"}',
            b'{"order":"o-1","amount":100}', now, now)


def _in_one_transaction(handler: Any, floor: sa.Table, n: int) -> dict[str, Any]:
    from idempotent_tasks import current_outbox
    from idempotent_tasks.outbox import kafka_record

    result: dict[str, Any] = {}
    sql = _floor_insert(floor)

    def body(conn: sa.Connection) -> None:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        outbox = current_outbox()
        payload = {"order": "o-1", "amount": 100}
        measured = interleave({
            "floor": lambda i: cursor.execute(sql, _floor_params(i)),
            "send": lambda _i: outbox.send(kafka_record("orders", payload)),
        }, n)
        result.update({"send µs": round(measured.median("send"), 2),
                       "floor µs": round(measured.median("floor"), 2),
                       "ratio": round(measured.ratio("send", "floor"), 3), "n": n})

    handler.execute_in_transaction(body, operation="bench.stage", tenant="acme",
                                   key=uuid.uuid4().hex)
    return result


def _per_body(handler: Any, floor: sa.Table, n: int) -> dict[str, Any]:
    """Whole transactional bodies (claim, body, SUCCESS, commit): what one send adds vs what
    one INSERT adds.  Differences of milliseconds-long runs: noisier than the figure above."""
    from idempotent_tasks import current_outbox
    from idempotent_tasks.outbox import kafka_record

    sql = _floor_insert(floor)
    run = uuid.uuid4().hex[:8]

    def empty(_conn: sa.Connection) -> None:
        return None

    def insert(conn: sa.Connection) -> None:
        conn.connection.dbapi_connection.cursor().execute(  # type: ignore[union-attr]
            sql, _floor_params(0))

    def send(_conn: sa.Connection) -> None:
        current_outbox().send(kafka_record("orders", {"order": "o-1", "amount": 100}))

    def op(fn: Any, name: str) -> Any:
        return lambda i: handler.execute_in_transaction(fn, operation=f"bench.{name}",
                                                        tenant="acme", key=f"{run}-{i}")

    measured = interleave({"empty": op(empty, "empty"), "insert": op(insert, "insert"),
                           "send": op(send, "send")}, n, batch=10, warmup=20)
    base = measured.median("empty")
    added_insert = measured.median("insert") - base
    added_send = measured.median("send") - base
    return {"body µs": round(base, 1), "body + insert µs": round(base + added_insert, 1),
            "body + send µs": round(base + added_send, 1),
            "per-body ratio": round(added_send / added_insert, 3) if added_insert > 0 else None}


# -- throughput -------------------------------------------------------------------------------
def _fill(store: Any, n: int, kind: str, target: Any) -> None:
    """``n`` PENDING rows, one per parent, as ``send`` writes them (bulk, to save time)."""
    from idempotent_tasks.outbox import staged_key
    from idempotent_tasks.outbox._staging import insert_statement
    from idempotent_tasks.outbox._targets import encode_fields

    sql = insert_statement("postgresql", store.table_prefix, notify=False)
    body = getattr(target, "body", None) or getattr(target, "value", None)
    fields = encode_fields(target.fields())
    now = time.time()
    rows = [("acme", "bench.relay", f"p{i}", 1, 0, staged_key("acme", "bench.relay", f"p{i}", 0),
             kind, target.destination, fields, body, now, now) for i in range(n)]
    with store.engine.begin() as conn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        for start in range(0, n, 5000):
            cursor.executemany(sql, rows[start:start + 5000])


def _drain_rate(store: Any, publisher: Any, n: int, batch_size: int) -> dict[str, Any]:
    from idempotent_tasks import IdempotencyHandler
    from idempotent_tasks.outbox import Outbox, OutboxRelay

    handler = IdempotencyHandler(store, metrics=None)
    relay = OutboxRelay(handler, Outbox(store), [publisher], batch_size=batch_size,
                        listen=False)
    _warm(publisher)
    try:
        start = time.perf_counter()
        total = relay.drain()
        elapsed = time.perf_counter() - start
    finally:
        relay.stop()
    return {"published": total.published, "seconds": round(elapsed, 3),
            "msg_per_s": round(total.published / elapsed, 1) if elapsed else None,
            "batch_size": batch_size}


def _warm(publisher: Any) -> None:
    """Connect before the clock starts (the first batch would pay the broker handshake, and
    for Kafka the idempotent producer's initialisation)."""
    producer = getattr(publisher, "producer", None)
    if producer is not None:
        producer.list_topics(timeout=15)
        producer.flush(15)
    opener = getattr(publisher, "_open", None)
    if opener is not None:
        opener()


def rabbitmq_throughput(n: int, batch_size: int = 1000) -> dict[str, Any]:
    from idempotent_tasks.outbox import RabbitMQPublisher, rabbitmq_message

    queue = _declare_queue()
    try:
        with _store() as store:
            _fill(store, n, "rabbitmq", rabbitmq_message({"order": "o-1"}, routing_key=queue))
            result = _drain_rate(store, RabbitMQPublisher(RABBITMQ_URL), n, batch_size)
        result["in_queue"] = _queue_depth(queue)
        return result
    finally:
        _delete_queue(queue)


def kafka_throughput(bootstrap: str, n: int, batch_size: int = 1000) -> dict[str, Any]:
    from idempotent_tasks.outbox import KafkaPublisher, kafka_record

    topic = _create_topic(bootstrap)
    with _store() as store:
        _fill(store, n, "kafka", kafka_record(topic, {"order": "o-1"}))
        return _drain_rate(store, KafkaPublisher({"bootstrap.servers": bootstrap}), n,
                           batch_size)


# -- latency ----------------------------------------------------------------------------------
def latency(kind: str, n: int, bootstrap: str | None = None) -> dict[str, Any]:
    """Commit → arrival at a consumer, with a LISTENing relay thread."""
    from idempotent_tasks import IdempotencyHandler, current_outbox
    from idempotent_tasks.outbox import Outbox, OutboxRelay

    with _store() as store, _receiver(kind, bootstrap) as (publisher, target, arrivals):
        handler = IdempotencyHandler(store, metrics=None)
        relay = OutboxRelay(handler, Outbox(store), [publisher], poll_interval=5.0)
        relay.start()
        committed: dict[str, float] = {}
        try:
            time.sleep(0.5)  # the relay's LISTEN is up before the first commit
            for i in range(n):
                key = handler.execute_in_transaction(
                    lambda _conn: current_outbox().send(target).key, operation="bench.latency",
                    tenant="acme", key=f"l{i}")
                committed[key] = time.time()
                time.sleep(0.005)  # a steady trickle: latency, not throughput
            deadline = time.monotonic() + 30
            while len(arrivals) < n and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            relay.stop()
        ms = sorted((arrivals[k] - t) * 1000 for k, t in committed.items() if k in arrivals)
    if not ms:
        return {"received": 0}
    return {"received": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max_ms": round(ms[-1], 2)}


@contextlib.contextmanager
def _receiver(kind: str, bootstrap: str | None) -> Iterator[tuple[Any, Any, dict[str, float]]]:
    arrivals: dict[str, float] = {}
    stop = threading.Event()
    if kind == "rabbitmq":
        from idempotent_tasks.outbox import RabbitMQPublisher, rabbitmq_message

        queue = _declare_queue()
        thread = threading.Thread(target=_consume_rabbit, args=(queue, arrivals, stop),
                                  daemon=True)
        publisher: Any = RabbitMQPublisher(RABBITMQ_URL)
        target: Any = rabbitmq_message(b"x", routing_key=queue)
    else:
        from idempotent_tasks.outbox import KafkaPublisher, kafka_record

        assert bootstrap is not None
        topic = _create_topic(bootstrap)
        thread = threading.Thread(target=_consume_kafka, args=(bootstrap, topic, arrivals, stop),
                                  daemon=True)
        publisher = KafkaPublisher({"bootstrap.servers": bootstrap, "linger.ms": 0})
        target = kafka_record(topic, b"x")
        queue = ""
    thread.start()
    try:
        yield publisher, target, arrivals
    finally:
        stop.set()
        thread.join(10)
        if queue:
            _delete_queue(queue)


def _consume_rabbit(queue: str, arrivals: dict[str, float], stop: threading.Event) -> None:
    import amqp

    from idempotent_tasks.outbox.publishers._rabbitmq import connection_options

    conn = amqp.Connection(**connection_options(RABBITMQ_URL))
    conn.connect()
    channel = conn.channel()
    channel.basic_consume(queue, no_ack=True, callback=lambda m: arrivals.__setitem__(
        m.properties["message_id"], time.time()))
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)
    conn.close()


def _consume_kafka(bootstrap: str, topic: str, arrivals: dict[str, float],
                   stop: threading.Event) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    while not stop.is_set():
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            headers = dict(message.headers() or [])
            arrivals[headers["idempotency-key"].decode()] = time.time()
    consumer.close()


# -- broker helpers ---------------------------------------------------------------------------
@contextlib.contextmanager
def _channel() -> Iterator[Any]:
    import amqp

    from idempotent_tasks.outbox.publishers._rabbitmq import connection_options

    conn = amqp.Connection(**connection_options(RABBITMQ_URL))
    conn.connect()
    try:
        yield conn.channel()
    finally:
        conn.close()


def _declare_queue() -> str:
    queue = f"bench-outbox-{uuid.uuid4().hex[:8]}"
    with _channel() as channel:
        channel.queue_declare(queue, durable=True, auto_delete=False)
    return queue


def _queue_depth(queue: str) -> int:
    with _channel() as channel:
        return int(channel.queue_declare(queue, passive=True).message_count)


def _delete_queue(queue: str) -> None:
    with contextlib.suppress(Exception), _channel() as channel:
        channel.queue_delete(queue)


def _create_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"bench-outbox-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        future.result(15)
    return topic


# -- the section ------------------------------------------------------------------------------
def run(n: int, relay_n: int, latency_n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"staging": staging(n)}
    out["relay rabbitmq"] = rabbitmq_throughput(relay_n)
    out["latency rabbitmq"] = latency("rabbitmq", latency_n)
    with kafka_broker() as bootstrap:
        out["relay kafka"] = kafka_throughput(bootstrap, relay_n)
        out["latency kafka"] = latency("kafka", latency_n, bootstrap)
    return out


def table(data: dict[str, Any], console: Console) -> None:
    from .report import _num, _ratio, _table

    s = data.get("staging", {})
    t = _table("Outbox on PostgreSQL: staging vs one INSERT (interleaved medians), relay "
               "throughput, commit → arrival latency",
               ["measure", "detail", "value", "reference", "ratio"])
    t.add_row("staging", "send() vs INSERT of the row, µs", _num(s.get("send µs")),
              _num(s.get("floor µs")), _ratio(s.get("ratio")))
    t.add_row("staging per body", "body+send vs body+INSERT, µs", _num(s.get("body + send µs")),
              _num(s.get("body + insert µs")), _ratio(s.get("per-body ratio")))
    for broker in ("rabbitmq", "kafka"):
        r = data.get(f"relay {broker}", {})
        t.add_row(f"relay → {broker}", f"{r.get('published', '-')} rows, batch "
                  f"{r.get('batch_size', '-')}", f"{_num(r.get('msg_per_s'), 0)} msg/s",
                  f"{_num(r.get('seconds'), 2)} s", "-")
        lat = data.get(f"latency {broker}", {})
        t.add_row(f"latency → {broker}", f"{lat.get('received', '-')} messages",
                  f"p50 {_num(lat.get('p50_ms'), 2)} ms", f"p99 {_num(lat.get('p99_ms'), 2)} ms",
                  "-")
    console.print(t)


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    from .report import _check, _get

    rows = [_check("outbox staging vs one INSERT", _get(report, "outbox", "staging", "ratio"),
                   STAGE_TARGET)]
    for broker in ("rabbitmq", "kafka"):
        rows.append(_check(f"outbox relay → {broker} msg/s",
                           _get(report, "outbox", f"relay {broker}", "msg_per_s"),
                           THROUGHPUT_TARGET, fmt="{:,.0f}", at_least=True))
    return rows
