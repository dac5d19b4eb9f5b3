"""Staging (docs/outbox.md): ``current_outbox().send(...)`` writes through the body's own
transaction — it commits with the body's writes and SUCCESS, or not at all — on SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryStore,
    Status,
    current_outbox,
)
from idempotent_tasks._core.keys import derive_key
from idempotent_tasks.consumers import IdempotentConsumer, Message
from idempotent_tasks.outbox import (
    Outbox,
    RowStatus,
    as_target,
    celery_task,
    dramatiq_message,
    kafka_record,
    staged_key,
)

from .conftest import TENANT, Env


class Declined(Exception):
    pass


def test_outbox_send_commits_with_the_body(env: Env) -> None:
    def charge(conn: sa.Connection) -> list[str]:
        env.write(conn, "charge", "o-1")
        outbox = current_outbox()
        first = outbox.celery_task("payments.capture", args=["o-1"], queue="payments")
        second = outbox.kafka_record("orders", {"order": "o-1", "event": "charged"})
        return [first.key, second.key]

    keys = env.handler.execute_in_transaction(
        charge, operation="payments.charge", tenant=TENANT, key="k-1", payload={"o": 1})
    rows = env.outbox.rows()
    assert [(r.kind, r.position, r.status) for r in rows] == [
        ("celery", 0, RowStatus.PENDING), ("kafka", 1, RowStatus.PENDING)]
    assert [r.key for r in rows] == keys == [
        derive_key(TENANT, "payments.charge", "k-1", "outbox", "0"),
        derive_key(TENANT, "payments.charge", "k-1", "outbox", "1")]
    assert {(r.tenant, r.operation, r.parent_key) for r in rows} == {
        (TENANT, "payments.charge", "k-1")}
    record = env.handler.get_record(operation="payments.charge", tenant=TENANT, key="k-1")
    assert record is not None and record.status is Status.SUCCESS
    assert rows[0].parent_token == record.fencing_token
    assert rows[0].destination == "payments.capture"
    assert rows[0].fields["args"] == ["o-1"] and rows[0].fields["options"] == {"queue": "payments"}
    assert rows[1].body == b'{"order":"o-1","event":"charged"}'
    assert env.ledger_rows() == [("charge", "o-1")]
    # a redelivery replays: nothing is staged twice
    again = env.handler.execute_in_transaction(
        charge, operation="payments.charge", tenant=TENANT, key="k-1", payload={"o": 1})
    assert again == keys and len(env.outbox.rows()) == 2


def test_outbox_rollback_stages_nothing(env: Env) -> None:
    def charge(conn: sa.Connection) -> None:
        env.write(conn, "charge", "o-2")
        current_outbox().celery_task("payments.capture", args=["o-2"])
        raise Declined("card declined")

    with pytest.raises(Declined):
        env.handler.execute_in_transaction(
            charge, operation="payments.charge", tenant=TENANT, key="k-2",
            permanent=(Declined,))
    assert env.outbox.rows() == [] and env.ledger_rows() == []


def test_outbox_unserialisable_message_fails_the_body_and_stages_nothing(env: Env) -> None:
    def charge(conn: sa.Connection) -> None:
        env.write(conn, "charge", "o-3")
        current_outbox().celery_task("payments.capture", args=[object()])

    with pytest.raises(ConfigurationError, match="JSON-serialisable"):
        env.handler.execute_in_transaction(
            charge, operation="payments.charge", tenant=TENANT, key="k-3")
    assert env.outbox.rows() == [] and env.ledger_rows() == []


def test_outbox_stale_owner_staged_rows_vanish_with_its_rollback(pg_env: Env) -> None:
    """A body paused past its lease is taken over; the winner's rows commit, the stale
    owner's are rolled back with its final (refused) update.  PostgreSQL only: on SQLite the
    paused body holds the one write lock, so no takeover can happen meanwhile."""
    env = pg_env
    started, release = threading.Event(), threading.Event()
    out: list[Any] = []

    def body(who: str) -> Any:
        def run(conn: sa.Connection) -> str:
            env.write(conn, who, "o-4")
            current_outbox().celery_task("payments.capture", args=[who])
            if who == "stale":
                started.set()
                assert release.wait(20)
            return who
        return run

    def stale() -> None:
        out.append(env.handler.execute_in_transaction(
            body("stale"), operation="payments.charge", tenant=TENANT, key="k-4",
            lease_timeout=30))

    thread = threading.Thread(target=stale)
    thread.start()
    try:
        assert started.wait(20)
        env.clock.advance(31)
        assert env.handler.execute_in_transaction(
            body("fresh"), operation="payments.charge", tenant=TENANT, key="k-4",
            lease_timeout=30) == "fresh"
    finally:
        release.set()
        thread.join(20)
    assert out == ["fresh"]
    rows = env.outbox.rows()
    assert [r.fields["args"] for r in rows] == [["fresh"]]
    record = env.handler.get_record(operation="payments.charge", tenant=TENANT, key="k-4")
    assert record is not None and rows[0].parent_token == record.fencing_token
    assert rows[0].key == staged_key(TENANT, "payments.charge", "k-4", 0)
    assert env.ledger_rows() == [("fresh", "o-4")]


def test_current_outbox_outside_a_transactional_body_is_refused(env: Env) -> None:
    with pytest.raises(ConfigurationError) as outside:
        current_outbox()
    assert outside.value.code is ErrorCode.CONFIGURATION_ERROR

    def plain() -> None:
        current_outbox()

    with pytest.raises(IdempotencyError, match="transactional body"):
        env.handler.execute(plain, operation="plain", tenant=TENANT, key="k-5",
                            permanent=(ConfigurationError,))

    inner = IdempotencyHandler(MemoryStore(), metrics=None)  # no second claim on SQLite's lock

    def nested(conn: sa.Connection) -> None:
        inner.execute(plain, operation="nested", tenant=TENANT, key="k-6",
                      permanent=(ConfigurationError,))

    with pytest.raises(IdempotencyError, match="nested"):
        env.handler.execute_in_transaction(nested, operation="outer", tenant=TENANT, key="k-7",
                                           permanent=(ConfigurationError,))
    assert env.outbox.rows() == []


def test_outbox_targets_from_celery_signatures_and_dramatiq_messages() -> None:
    from celery import Celery, chain
    from dramatiq import Actor
    from dramatiq.brokers.stub import StubBroker

    app = Celery("outbox-targets", set_as_current=False)

    @app.task(name="payments.capture")
    def capture(order: str) -> None: ...

    target = as_target(capture.s("o-1").set(queue="payments", countdown=5))
    assert target == celery_task("payments.capture", ["o-1"], queue="payments", countdown=5)
    with pytest.raises(ConfigurationError, match="single Celery signature"):
        as_target(chain(capture.s("o-1"), capture.s("o-2")))
    with pytest.raises(ConfigurationError, match="unsupported options"):
        celery_task("payments.capture", link="x")

    broker = StubBroker()
    actor: Actor[Any, Any] = Actor(lambda order: None, broker=broker, actor_name="ship",
                                   queue_name="shipping", priority=0, options={})
    message = as_target(actor.message("o-1"))
    assert message == dramatiq_message("ship", ["o-1"], queue_name="shipping")
    record = kafka_record("orders", "text", key="o-1", headers={"h": b"\xff"})
    assert record.value == b"text" and record.key == b"o-1" and record.headers == {"h": b"\xff"}
    with pytest.raises(ConfigurationError, match="cannot stage"):
        as_target({"topic": "orders"})


def test_outbox_argument_reaches_a_transactional_consumer_body(env: Env) -> None:
    consumer = IdempotentConsumer(env.handler, operation="orders.created", default_tenant=TENANT,
                                  transactional=True)

    def body(payload: dict[str, Any], conn: sa.Connection, outbox: Any) -> str:
        env.write(conn, "consume", payload["order"])
        return outbox.rabbitmq_message({"order": payload["order"]}, routing_key="ship").key

    message = Message(b'{"order": "o-8"}', {"idempotency-key": "m-8"})
    outcome = consumer.process(message, body)
    assert outcome.kind == "executed"
    (row,) = env.outbox.rows()
    assert row.key == outcome.result == staged_key(TENANT, "orders.created", "m-8", 0)
    assert row.kind == "rabbitmq" and row.fields["content_type"] == "application/json"
    assert consumer.process(message, body).kind == "replayed"
    [second] = consumer.process_batch([Message(b'{"order": "o-9"}', {"idempotency-key": "m-9"})],
                                      body)
    assert second.kind == "executed" and len(env.outbox.rows()) == 2


def test_outbox_table_is_created_by_create_schema_and_mismatches_are_refused(env: Env) -> None:
    inspector = sa.inspect(env.store.engine)
    assert inspector.has_table(env.outbox.table.name) and inspector.has_table(env.outbox.sent.name)
    assert env.outbox.sent.name == f"{env.store.table_prefix}_outbox_sent"
    env.store.create_schema()  # idempotent
    other = Outbox(env.store, table_prefix=f"{env.store.table_prefix}_x")
    bad = sa.Table(other.table.name, sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    bad.create(env.store.engine)
    try:
        with pytest.raises(ConfigurationError, match="does not match"):
            other.create_schema()
    finally:
        bad.drop(env.store.engine)
    env.store.drop_schema()
    assert not sa.inspect(env.store.engine).has_table(env.outbox.table.name)
    env.store.create_schema()


def test_outbox_on_mariadb() -> None:
    """MySQL / MariaDB: staging commits or rolls back with the body, the relay publishes in
    order, refused rows are poisoned and their successors go on."""
    from idempotent_tasks.outbox import OutboxRelay
    from idempotent_tasks.outbox.publishers import SENT, rejected
    from tests.stores._backends import make_mysql_store

    from .conftest import Recorder

    store = make_mysql_store()
    try:
        handler = IdempotencyHandler(store, metrics=None)

        def body(conn: sa.Connection) -> None:
            outbox = current_outbox()
            outbox.celery_task("refused.task")
            outbox.celery_task("next.task", ["é"])

        def rolled_back(conn: sa.Connection) -> None:
            current_outbox().celery_task("never.task")
            raise Declined("no")

        handler.execute_in_transaction(body, operation="op", tenant="tenänt", key="k-1")
        with pytest.raises(Declined):
            handler.execute_in_transaction(rolled_back, operation="op", tenant="t", key="k-2",
                                           permanent=(Declined,))
        outbox = Outbox(store)
        assert [(r.tenant, r.destination) for r in outbox.rows()] == [
            ("tenänt", "refused.task"), ("tenänt", "next.task")]
        recorder = Recorder("celery", answer=lambda row: rejected("no such task")
                            if row.destination == "refused.task" else SENT)
        relay = OutboxRelay(handler, outbox, [recorder], listen=False, max_attempts=1)
        assert relay.drain().published == 1
        relay.stop()
        assert [(r.destination, r.status) for r in outbox.rows()] == [
            ("refused.task", RowStatus.POISONED), ("next.task", RowStatus.SENT)]
        assert [r.fields["args"] for r in recorder.rows] == [[], ["é"]]
    finally:
        store.drop_schema()
        store.close()
