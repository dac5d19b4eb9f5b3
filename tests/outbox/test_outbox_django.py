"""The outbox on ``DjangoStore``: the app's migration creates ``idempotency_outbox``, a
transactional body's ORM writes and its staged messages commit together in
``transaction.atomic`` (or neither does), and a relay reads the same table — on PostgreSQL and
SQLite (the Django test project's databases, created by pytest-django)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, current_outbox
from idempotent_tasks.outbox import Outbox, OutboxRelay
from tests.django import conftest as django_setup  # configures Django for this module

from .conftest import Recorder

alias = django_setup.alias  # the fixture: one run per database


def _outbox_rows(alias_name: str) -> list[tuple[Any, ...]]:
    from django.db import connections

    with connections[alias_name].cursor() as cursor:
        cursor.execute("SELECT id, kind, destination, status, position FROM idempotency_outbox "
                       "UNION ALL SELECT id, kind, destination, status, position "
                       "FROM idempotency_outbox_sent ORDER BY 1")
        return [row[1:] for row in cursor.fetchall()]


def test_outbox_stages_with_django_orm_writes(alias: str) -> None:
    from idempotent_tasks.django import DjangoStore
    from idempotent_tasks.outbox import celery_task
    from tests.django.project.orders.models import Charge

    handler = IdempotencyHandler(DjangoStore(using=alias), metrics=None)

    def charge(conn: Any) -> str:
        Charge.objects.using(alias).create(order_id="o-1", amount=5)
        return current_outbox().send(celery_task("payments.capture", ["o-1"])).key

    key = handler.execute_in_transaction(charge, operation="pay", tenant="t", key="k-1")

    def declined(conn: Any) -> None:
        Charge.objects.using(alias).create(order_id="o-2", amount=5)
        current_outbox().send(celery_task("payments.capture", ["o-2"]))
        raise ValueError("declined")

    with pytest.raises(ValueError):
        handler.execute_in_transaction(declined, operation="pay", tenant="t", key="k-2",
                                       permanent=(ValueError,))
    assert _outbox_rows(alias) == [("celery", "payments.capture", "PENDING", 0)]
    assert sorted(Charge.objects.using(alias).values_list("order_id", flat=True)) == ["o-1"]
    outbox = Outbox(_database_url(alias))  # the relay reads the Django app's table
    recorder = Recorder("celery")
    relay = OutboxRelay(handler, outbox, [recorder], listen=False)
    try:
        assert relay.run_once().published == 1
    finally:
        relay.stop()
        outbox.close()
    assert [r.key for r in recorder.rows] == [key]
    assert _outbox_rows(alias) == [("celery", "payments.capture", "SENT", 0)]


def _database_url(alias_name: str) -> str:
    from django.db import connections

    s = connections[alias_name].settings_dict
    if connections[alias_name].vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    return f"postgresql+psycopg://{s.get('USER') or 'postgres'}@{host}:{s.get('PORT') or 5432}/{s['NAME']}"


@pytest.mark.parametrize("alias_name", django_setup.on_databases())
def test_outbox_migration_is_reversible(alias_name: str) -> None:
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", "idempotent_tasks", "0001", database=alias_name, verbosity=0)
    try:
        with connections[alias_name].cursor() as cursor:
            names = connections[alias_name].introspection.table_names(cursor)
        assert "idempotency_outbox" not in names and "idempotency_outbox_sent" not in names
    finally:
        call_command("migrate", "idempotent_tasks", database=alias_name, verbosity=0)
    assert _outbox_rows(alias_name) == []
