"""Where a relay runs: a Celery beat entry, Celery workers, Dramatiq workers — and staging
from an async body (``send_async`` on an ``AsyncSQLStore``)."""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, current_outbox
from idempotent_tasks.outbox import Outbox, OutboxRelay, RowStatus, celery_task

from .conftest import TENANT, Env, Recorder, wait_for


class Sender:
    """What Celery's worker signals are sent by (the consumer / the worker), for one app."""

    def __init__(self, app: Any) -> None:
        self.app = app


def stage(env: Env, key: str) -> None:
    def body(conn: sa.Connection) -> None:
        current_outbox().send(celery_task("t.one", [key]))

    env.handler.execute_in_transaction(body, operation="op", tenant=TENANT, key=key)


def test_outbox_relay_on_celery_beat_and_in_celery_workers(env: Env) -> None:
    from celery import Celery, signals

    from idempotent_tasks.outbox.celery import RELAY_TASK, setup_relay

    app = Celery("outbox-beat", set_as_current=False)
    app.conf.task_always_eager = True
    recorder = Recorder("celery")
    relay = OutboxRelay(env.handler, env.outbox, [recorder], listen=False)
    setup_relay(app, relay, beat=True, every=2.0, worker=True)
    entry = app.conf.beat_schedule[RELAY_TASK]
    assert entry["task"] == RELAY_TASK and entry["schedule"] == 2.0
    stage(env, "k-1")
    assert app.tasks[RELAY_TASK].apply().get() == {"published": 1, "rejected": 0, "poisoned": 0}
    standby = OutboxRelay(env.handler, env.outbox, [Recorder("celery")], listen=False)
    assert standby.held_kinds() == ["celery"]  # the beat run gave its lease up
    standby.release()

    other = Sender(Celery("another", set_as_current=False))
    signals.worker_ready.send(sender=other)  # another app's worker: not ours
    assert relay._thread is None
    signals.worker_ready.send(sender=Sender(app))
    try:
        stage(env, "k-2")
        wait_for(lambda: len(recorder.rows) == 2, 20, "the in-worker relay")
    finally:
        signals.worker_shutdown.send(sender=Sender(app))
    assert relay._thread is not None and not relay._thread.is_alive()


def test_outbox_relay_in_dramatiq_workers(env: Env) -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from idempotent_tasks.outbox.dramatiq import OutboxRelayMiddleware

    recorder = Recorder("celery")
    relay = OutboxRelay(env.handler, env.outbox, [recorder], listen=False, poll_interval=0.05)
    broker = StubBroker()
    broker.add_middleware(OutboxRelayMiddleware(relay))
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    try:
        stage(env, "k-3")
        wait_for(lambda: len(recorder.rows) == 1, 20, "the relay started with the worker")
    finally:
        worker.stop()
        broker.close()
    assert relay._thread is not None and not relay._thread.is_alive()


def test_outbox_send_async_from_an_async_transactional_body(pg_env: Env) -> None:
    from idempotent_tasks import AsyncSQLStore
    from tests._services import POSTGRES_URL

    store = AsyncSQLStore(POSTGRES_URL, table_prefix=pg_env.store.table_prefix)
    handler = IdempotencyHandler(store, metrics=None)

    async def body(conn: Any) -> str:
        await conn.execute(f'INSERT INTO "{pg_env.ledger.name}" (hop, key) VALUES (%s, %s)',
                           ("async", "k-4"))
        staged = await current_outbox().send_async(celery_task("t.async", ["k-4"]))
        return staged.key

    async def main() -> Any:
        try:
            return await handler.run_async(body, operation="op", tenant=TENANT, key="k-4",
                                           transactional=True)
        finally:
            await store.close()

    outcome = asyncio.run(main())
    assert outcome.kind == "executed", outcome
    (row,) = Outbox(pg_env.store).rows()
    assert row.key == outcome.result and row.status is RowStatus.PENDING
    assert pg_env.ledger_rows() == [("async", "k-4")]
