"""The relay (docs/outbox.md): in order per parent, at least once, retried then poisoned,
back-pressure on a broker outage, one lease holder per kind, LISTEN/NOTIFY wake-up, SENT rows
kept ``ttl`` — on SQLite and PostgreSQL, publishing to a real RabbitMQ (a vhost of our own)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from idempotent_tasks import IdempotencyHandler, PrometheusMetrics, current_outbox
from idempotent_tasks.outbox import OutboxRelay, RowStatus
from idempotent_tasks.outbox.publishers import SENT, RabbitMQPublisher, rejected

from .conftest import TENANT, Env, NoSettle, Recorder, declare_queue, read_queue, wait_for


def stage(env: Env, key: str, messages: list[Any], operation: str = "payments.charge") -> None:
    def body(conn: sa.Connection) -> None:
        env.write(conn, "charge", key)
        for message in messages:
            current_outbox().send(message)

    env.handler.execute_in_transaction(body, operation=operation, tenant=TENANT, key=key)


def rabbit(queue: str, n: int, exchange: str = "") -> Any:
    from idempotent_tasks.outbox import rabbitmq_message

    return rabbitmq_message({"n": n}, routing_key=queue, exchange=exchange)


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_outbox_relay_publishes_in_order_per_parent_to_rabbitmq(env: Env, rabbit_url: str
                                                               ) -> None:
    queue = declare_queue(rabbit_url)
    stage(env, "parent-a", [rabbit(queue, n) for n in range(5)])
    stage(env, "parent-b", [rabbit(queue, 10 + n) for n in range(3)])
    registry = CollectorRegistry()
    handler = IdempotencyHandler(env.store, metrics=PrometheusMetrics(registry), clock=env.clock)
    relay = OutboxRelay(handler, env.outbox, [RabbitMQPublisher(rabbit_url)], batch_size=2,
                        listen=False)
    try:
        total = relay.drain()
    finally:
        relay.stop()
    assert total.published == 8 and total.rows == 8
    messages = read_queue(rabbit_url, queue, 8)
    by_parent: dict[str, list[int]] = {}
    for m in messages:
        n = int(m.body.decode().split(":")[1].rstrip("}"))
        by_parent.setdefault("a" if n < 10 else "b", []).append(n)
    assert by_parent == {"a": [0, 1, 2, 3, 4], "b": [10, 11, 12]}
    rows = {r.key: r for r in env.outbox.rows()}
    assert all(r.status is RowStatus.SENT and r.attempts == 1 for r in rows.values())
    for m in messages:
        key = m.properties["message_id"]
        assert m.headers["idempotency-key"] == key and key in rows
        assert m.headers["idempotency-tenant"] == TENANT and m.properties["delivery_mode"] == 2
    assert metric(registry, "idempotency_outbox_published_total", kind="rabbitmq") == 8
    assert metric(registry, "idempotency_outbox_lag_seconds_count", kind="rabbitmq") == 8
    assert metric(registry, "idempotency_outbox_staged_total", kind="rabbitmq") == 0  # metrics=None


def test_outbox_rejected_rows_are_retried_with_backoff_then_poisoned(env: Env, rabbit_url: str
                                                                    ) -> None:
    """A publish to an exchange that does not exist is refused (404): counted, retried after
    a growing backoff, poisoned at ``max_attempts``; the parent's next message waits for it
    (order), then goes out once it is poisoned."""
    queue = declare_queue(rabbit_url)
    stage(env, "parent-c", [rabbit(queue, 0, exchange="no-such-exchange"), rabbit(queue, 1)])
    registry = CollectorRegistry()
    handler = IdempotencyHandler(env.store, metrics=PrometheusMetrics(registry), clock=env.clock)
    relay = OutboxRelay(handler, env.outbox, [RabbitMQPublisher(rabbit_url)], max_attempts=3,
                        retry_backoff=(10.0, 100.0), listen=False)
    try:
        first = relay.run_once()
        assert (first.rows, first.rejected, first.published) == (2, 1, 0)  # its sibling waits
        failing, waiting = env.outbox.rows()
        assert failing.attempts == 1 and failing.status is RowStatus.PENDING
        assert "NOT_FOUND" in (failing.last_error or "") or "404" in (failing.last_error or "")
        assert 8 <= failing.available_at - env.clock() <= 12  # 10 s, jittered
        assert relay.run_once().rows == 0  # backing off, and its sibling waits behind it
        env.clock.advance(13)
        assert relay.run_once().rejected == 1
        env.clock.advance(25)
        assert relay.run_once().poisoned == 1
        poisoned, _ = env.outbox.rows()
        assert poisoned.status is RowStatus.POISONED and poisoned.attempts == 3
        assert relay.run_once().published == 1
    finally:
        relay.stop()
    assert [int(m.body.decode()[-2]) for m in read_queue(rabbit_url, queue, 1)] == [1]
    assert env.outbox.rows()[1].key == waiting.key and env.outbox.rows()[1].status is RowStatus.SENT
    assert metric(registry, "idempotency_outbox_poisoned_total", kind="rabbitmq") == 1
    assert metric(registry, "idempotency_outbox_publish_failures_total", kind="rabbitmq",
                  reason="rejected") == 3


def test_outbox_broker_outage_backs_off_without_counting_attempts(env: Env, rabbit_url: str
                                                                 ) -> None:
    from tests._services import free_port

    queue = declare_queue(rabbit_url)
    stage(env, "parent-d", [rabbit(queue, 0)])
    down = RabbitMQPublisher(f"amqp://guest:guest@127.0.0.1:{free_port()}/", connect_timeout=1)
    relay = OutboxRelay(env.handler, env.outbox, [down], listen=False,
                        broker_backoff=(5.0, 60.0))
    try:
        report = relay.run_once()
        assert (report.rows, report.unavailable, report.rejected) == (1, 1, 0)
        assert relay.run_once().rows == 0  # the broker's backoff: its rows are not taken
        (row,) = env.outbox.rows()
        assert row.attempts == 0 and row.status is RowStatus.PENDING
        env.clock.advance(6)
        assert relay.run_once().unavailable == 1  # tried again after the backoff
    finally:
        relay.stop()
    up = OutboxRelay(env.handler, env.outbox, [RabbitMQPublisher(rabbit_url)], listen=False)
    try:
        assert up.drain().published == 1
    finally:
        up.stop()
    assert len(read_queue(rabbit_url, queue, 1)) == 1


def test_outbox_only_the_lease_holder_publishes(env: Env) -> None:
    from idempotent_tasks.outbox import celery_task

    first, second = Recorder("celery"), Recorder("celery")
    one = OutboxRelay(env.handler, env.outbox, [first], listen=False)
    two = OutboxRelay(env.handler, env.outbox, [second], listen=False)
    stage(env, "parent-e", [celery_task("t.one")])
    assert one.run_once().published == 1
    stage(env, "parent-f", [celery_task("t.two")])
    assert two.run_once().kinds == ()  # standing by
    assert len(second.rows) == 0
    one.stop()  # gives the lease up
    assert two.run_once().published == 1
    two.stop()
    assert [r.destination for r in first.rows + second.rows] == ["t.one", "t.two"]


def test_outbox_sent_rows_are_kept_for_ttl_then_cleaned(env: Env) -> None:
    from idempotent_tasks.outbox import celery_task

    relay = OutboxRelay(env.handler, env.outbox, [Recorder("celery")], listen=False, ttl=100)
    stage(env, "parent-g", [celery_task("t.one")])
    assert relay.run_once().published == 1
    (row,) = env.outbox.rows()
    assert row.status is RowStatus.SENT and row.expires_at == pytest.approx(env.clock() + 100)
    env.clock.advance(99)
    assert env.outbox.cleanup(now=env.clock()) == 0
    env.clock.advance(2)
    relay.run_once()  # its housekeeping purges what expired
    relay.stop()
    assert env.outbox.rows() == []


def test_outbox_relay_keeps_a_row_it_could_not_mark_and_publishes_it_again(env: Env) -> None:
    """A relay that published but died before marking leaves the row PENDING: the next relay
    publishes it again, with the same key (the receiver's idempotency dedupes it)."""
    from idempotent_tasks.outbox import celery_task

    stage(env, "parent-h", [celery_task("t.one")])
    crashed = Recorder("celery")
    relay = OutboxRelay(env.handler, env.outbox, [crashed], listen=False)
    relay.outbox = NoSettle(env.outbox)  # type: ignore[assignment]
    relay.run_once()
    relay.stop()
    assert env.outbox.rows()[0].status is RowStatus.PENDING
    again = Recorder("celery")
    second = OutboxRelay(env.handler, env.outbox, [again], listen=False)
    assert second.run_once().published == 1
    second.stop()
    assert [r.key for r in crashed.rows] == [r.key for r in again.rows]


def test_outbox_poisoned_by_a_publisher_answer_after_max_attempts(env: Env) -> None:
    from idempotent_tasks.outbox import kafka_record

    stage(env, "parent-i", [kafka_record("orders", b"x")])
    refusing = Recorder("kafka", answer=lambda _row: rejected("MSG_SIZE_TOO_LARGE"))
    relay = OutboxRelay(env.handler, env.outbox, [refusing], listen=False, max_attempts=1)
    assert relay.run_once().poisoned == 1
    relay.stop()
    (row,) = env.outbox.rows()
    assert row.status is RowStatus.POISONED and row.last_error == "MSG_SIZE_TOO_LARGE"


def test_outbox_listen_notify_wakes_the_relay_at_commit(pg_env: Env) -> None:
    """PostgreSQL: the staging statement notifies at commit (and only then); a relay that
    polls every 60 s publishes right after the commit."""
    from idempotent_tasks.outbox import celery_task

    env = pg_env
    recorder = Recorder("celery")
    relay = OutboxRelay(env.handler, env.outbox, [recorder], poll_interval=60.0)
    assert relay.waiter.wait(0.3) is False  # LISTEN is set up, nothing pending
    assert getattr(relay.waiter, "listening", False)

    def rolled_back(conn: sa.Connection) -> None:
        current_outbox().send(celery_task("t.never"))
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        env.handler.execute_in_transaction(rolled_back, operation="op", tenant=TENANT, key="r1",
                                           permanent=(RuntimeError,))
    assert relay.waiter.wait(1.0) is False  # a rolled-back transaction notifies nobody
    stage(env, "parent-j", [celery_task("t.one")])
    assert relay.waiter.wait(30.0) is True
    relay.start()
    try:
        assert relay.waiter is not None
        wait_for(lambda: len(recorder.rows) == 1, 20, "the first row")  # first poll at start
        stage(env, "parent-k", [celery_task("t.two")])
        wait_for(lambda: len(recorder.rows) == 2, 20, "the relay woken by NOTIFY (polls: 60 s)")
    finally:
        relay.stop()
    assert [r.destination for r in recorder.rows] == ["t.one", "t.two"]


def test_outbox_relay_thread_polls_and_stops_giving_its_leases_up(env: Env) -> None:
    from idempotent_tasks.outbox import celery_task

    recorder = Recorder("celery")
    relay = OutboxRelay(env.handler, env.outbox, [recorder], poll_interval=0.05, listen=False)
    relay.start()
    try:
        stage(env, "parent-l", [celery_task("t.one"), celery_task("t.two")])
        wait_for(lambda: len(recorder.rows) == 2, 20, "both rows")
    finally:
        relay.stop()
    assert not any(t.name == "idempotent-tasks-outbox-relay" and t.is_alive()
                   for t in threading.enumerate())
    standby = OutboxRelay(env.handler, env.outbox, [Recorder("celery")], listen=False)
    assert standby.held_kinds() == ["celery"]  # released at stop: no wait for expiry
    standby.stop()


def test_outbox_fan_out_goes_out_in_one_batch_in_order_and_stops_at_a_refusal(env: Env) -> None:
    """A body that stages many messages: one batch publishes them all, one round per
    position (every parent at once); a refused one stops its parent's later messages, the
    other parents go on."""
    from idempotent_tasks.outbox import celery_task

    stage(env, "fan-out", [celery_task("t.fan", [n]) for n in range(30)])
    stage(env, "refusing", [celery_task("t.refuse", [n]) for n in range(5)])
    recorder = Recorder("celery", answer=lambda row: rejected("no") if (
        row.destination == "t.refuse" and row.position == 2) else SENT)
    relay = OutboxRelay(env.handler, env.outbox, [recorder], listen=False)
    try:
        first = relay.run_once()
    finally:
        relay.stop()
    assert (first.rows, first.published, first.rejected) == (35, 32, 1)
    fan = [r.fields["args"][0] for r in recorder.rows if r.destination == "t.fan"]
    refused = [r.position for r in recorder.rows if r.destination == "t.refuse"]
    assert fan == list(range(30)) and refused == [0, 1, 2]
    waiting = env.outbox.rows(status="PENDING")
    assert [r.position for r in waiting] == [2, 3, 4]
    retry_at = {r.available_at for r in waiting}  # its successors wait for its retry
    assert len(retry_at) == 1 and retry_at.pop() > env.clock()
