"""``idempotent-tasks migrate`` creates the outbox table; ``outbox list|stats|retry|drop``
tend POISONED rows; ``relay --once`` publishes what is due (docs/operations.md)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from click.testing import CliRunner

from idempotent_tasks import SQLStore, current_outbox
from idempotent_tasks.cli import EXIT_RECORD_NOT_FOUND, cli
from idempotent_tasks.outbox import OutboxRelay, RowStatus, celery_task, rabbitmq_message
from idempotent_tasks.outbox.publishers import rejected

from .conftest import TENANT, Env, Recorder, declare_queue, read_queue


def invoke(env: Env, *args: str) -> tuple[int, str]:
    url = env.store.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        cli, ["--store", url, "--prefix", env.store.table_prefix, *args], catch_exceptions=False)
    return result.exit_code, result.output


def poison(env: Env, key: str) -> int:
    def body(conn: sa.Connection) -> None:
        current_outbox().send(celery_task("payments.capture", [key]))

    env.handler.execute_in_transaction(body, operation="payments.charge", tenant=TENANT, key=key)
    refusing = Recorder("celery", answer=lambda _row: rejected("NotRegistered: payments.capture"))
    relay = OutboxRelay(env.handler, env.outbox, [refusing], listen=False, max_attempts=1)
    assert relay.run_once().poisoned == 1
    relay.stop()
    return next(r.id for r in env.outbox.rows() if r.parent_key == key)


def test_outbox_cli_list_retry_drop(env: Env) -> None:
    first, second = poison(env, "k-1"), poison(env, "k-2")
    code, out = invoke(env, "outbox", "list", "--status", "POISONED", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [d["id"] for d in listed] == [first, second]
    assert listed[0]["last_error"] == "NotRegistered: payments.capture"
    assert listed[0]["destination"] == "payments.capture" and listed[0]["attempts"] == 1
    code, out = invoke(env, "outbox", "list")
    assert code == 0 and "payments.capture" in out and "POISONED" in out

    code, out = invoke(env, "outbox", "retry", str(first))
    assert code == 0 and "1 row(s) back to PENDING" in out
    row = env.outbox.get(first)
    assert row is not None and row.status is RowStatus.PENDING and row.attempts == 0
    code, out = invoke(env, "outbox", "retry", str(first))  # no longer POISONED
    assert code == EXIT_RECORD_NOT_FOUND and "no POISONED outbox row" in out

    code, out = invoke(env, "outbox", "drop", str(second), "--yes")
    assert code == 0 and "1 row(s) dropped" in out and env.outbox.get(second) is None
    code, out = invoke(env, "outbox", "drop", "999999", "--yes")
    assert code == EXIT_RECORD_NOT_FOUND
    code, out = invoke(env, "outbox", "stats", "--json")
    assert code == 0 and json.loads(out) == {"celery/PENDING": 1}


def test_outbox_cli_relay_once_publishes_to_rabbitmq(env: Env, rabbit_url: str) -> None:
    queue = declare_queue(rabbit_url)

    def body(conn: sa.Connection) -> None:
        current_outbox().send(rabbitmq_message(b"hello", routing_key=queue))

    env.handler.execute_in_transaction(body, operation="notify", tenant=TENANT, key="k-3")
    code, out = invoke(env, "relay", "--once", "--rabbitmq", rabbit_url)
    assert code == 0 and "published 1," in out
    (message,) = read_queue(rabbit_url, queue, 1)
    assert message.body == b"hello"
    assert env.outbox.rows()[0].status is RowStatus.SENT
    code, out = invoke(env, "relay", "--once")
    assert code == 2 and "name at least one broker" in out


def test_outbox_table_is_created_by_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = CliRunner().invoke(cli, ["--store", url, "--prefix", "app", "migrate"])
    assert result.exit_code == 0, result.output
    store = SQLStore(url, table_prefix="app")
    try:
        assert sa.inspect(store.engine).has_table("app_outbox")
    finally:
        store.close()
