"""The app's migrations build the SQL store's schema: ``SQLStore`` and the CLI work on the
tables Django created, the two stores share records and fencing tokens, and a database where
``SQLStore.create_schema()`` already ran is adopted by ``migrate`` (records kept)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from django.core.management import call_command
from django.db import connections

from idempotent_tasks import ConfigurationError, IdempotencyHandler, SQLStore, Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import main as cli_main
from idempotent_tasks.django import DjangoStore
from idempotent_tasks.django._schema import PREFIX

from ..stores._old_schema import KEPT, NOW, create_old_schema


def sql_url(alias: str) -> str:
    """The SQLAlchemy URL of this session's test database ``alias``."""
    s = connections[alias].settings_dict
    if alias == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgresql+psycopg://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


@pytest.fixture
def sql_store(alias: str) -> Iterator[SQLStore]:
    store = SQLStore(sql_url(alias))
    try:
        yield store
    finally:
        store.close()


def test_sqlstore_accepts_the_migrated_tables_and_shares_records_and_tokens(
    alias: str, sql_store: SQLStore
) -> None:
    sql_store.create_schema()  # refuses a table whose columns differ: these are its own
    django_h = IdempotencyHandler(DjangoStore(using=alias), metrics=None)
    sql_h = IdempotencyHandler(sql_store, metrics=None)
    assert django_h.execute(lambda: "from django", operation="op", tenant="t", key="a") == (
        "from django"
    )
    assert sql_h.execute(lambda: "not run", operation="op", tenant="t", key="a") == "from django"
    sql_h.execute(lambda: "from sqlstore", operation="op", tenant="t", key="b")
    a = django_h.get_record(operation="op", tenant="t", key="a")
    b = django_h.get_record(operation="op", tenant="t", key="b")
    assert a is not None and b is not None and b.response == "from sqlstore"
    c = DjangoStore(using=alias).create(Scope("t", "op", "c"), request_hash="h", now=time.time(),
                                        lease_expires_at=time.time() + 30)
    assert a.fencing_token < b.fencing_token < c.record.fencing_token  # one token source


def test_the_cli_inspects_what_django_wrote(alias: str, capsys: pytest.CaptureFixture[str]) -> None:
    handler = IdempotencyHandler(DjangoStore(using=alias), metrics=None)
    handler.execute(lambda: {"charged": 5}, operation="pay", tenant="acme", key="k1")
    capsys.readouterr()
    code = cli_main(["--store", sql_url(alias), "inspect", "acme", "pay", "k1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["status"] == "SUCCESS" and doc["response"] == {"charged": 5}


def migrate(alias: str, *args: str) -> None:
    call_command("migrate", "idempotent_tasks", *args, database=alias, verbosity=0)


@pytest.fixture
def unmigrated(alias: str) -> Iterator[str]:
    """The test database without the app's tables (migrated back afterwards)."""
    migrate(alias, "zero")
    try:
        yield alias
    finally:
        migrate(alias)


@pytest.mark.parametrize("flags", [(), ("--fake-initial",)], ids=["migrate", "fake-initial"])
def test_migrate_adopts_tables_sqlstore_created_with_their_records(
    unmigrated: str, flags: tuple[str, ...]
) -> None:
    alias = unmigrated
    store = SQLStore(sql_url(alias))
    try:
        store.create_schema()
        before = IdempotencyHandler(store, metrics=None)
        before.execute(lambda: "kept", operation="op", tenant="t", key="old")
        old = before.get_record(operation="op", tenant="t", key="old")
    finally:
        store.close()
    migrate(alias, *flags)
    handler = IdempotencyHandler(DjangoStore(using=alias), metrics=None)
    assert handler.execute(lambda: "ran again", operation="op", tenant="t", key="old") == "kept"
    handler.execute(lambda: "new", operation="op", tenant="t", key="new")
    new = handler.get_record(operation="op", tenant="t", key="new")
    assert old is not None and new is not None and new.fencing_token > old.fencing_token
    from idempotent_tasks.django.models import IdempotencyRecord

    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {"old", "new"}


def test_migrate_upgrades_the_previous_releases_tables(unmigrated: str) -> None:
    """Tables the release before recorded steps and UNCERTAIN made (``SQLStore`` or these
    migrations, same DDL) are adopted by ``0001`` and upgraded in place by ``0004``."""
    alias = unmigrated
    engine = sa.create_engine(sql_url(alias))
    try:
        with engine.begin() as conn:
            create_old_schema(conn, "sqlite" if alias == "sqlite" else "postgres", PREFIX)
    finally:
        engine.dispose()
    migrate(alias)
    store = DjangoStore(using=alias)
    kept = store.get(KEPT)
    assert kept is not None and kept.fencing_token == 7 and kept.response == b"ok"
    scope = Scope("t", "op", "new")
    token = store.create(scope, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    assert token.created and token.record.fencing_token > 7
    new = token.record.fencing_token
    assert store.save_steps(scope, token=new, steps=b"steps", now=NOW + 1)
    assert store.mark_uncertain(scope, token=new, now=NOW + 2, detail=b"unknown")
    assert store.load_steps(scope) == b"steps"
    got = store.get(scope)
    assert got is not None and got.status is Status.UNCERTAIN


def test_without_the_tables_the_store_says_migrate(unmigrated: str) -> None:
    handler = IdempotencyHandler(DjangoStore(using=unmigrated), metrics=None)
    outcome = handler.run(lambda: "x", operation="op", tenant="t", key="k")
    assert outcome.kind == "rejected" and outcome.error_code == "CONFIGURATION_ERROR"
    assert "python manage.py migrate" in (outcome.detail or "")
    with pytest.raises(ConfigurationError, match="manage\\.py migrate"):
        DjangoStore(using=unmigrated).get(Scope("t", "op", "k"))


def test_migrate_refuses_a_same_named_table_with_other_columns(unmigrated: str) -> None:
    with connections[unmigrated].cursor() as cursor:
        cursor.execute("CREATE TABLE idempotency_records (tenant TEXT, note TEXT)")
    try:
        with pytest.raises(ConfigurationError, match="does not match the idempotent_tasks schema"):
            migrate(unmigrated)
    finally:
        with connections[unmigrated].cursor() as cursor:
            cursor.execute("DROP TABLE idempotency_records")


def test_the_models_read_records_and_refuse_writes(alias: str) -> None:
    from idempotent_tasks.django.models import IdempotencyRecord, RetryCounter

    handler = IdempotencyHandler(DjangoStore(using=alias), metrics=None, max_retries=2)
    handler.execute(lambda: 1, operation="op", tenant="t", key="k")
    handler.run(_fail, operation="op", tenant="t", key="f")
    row = IdempotencyRecord.objects.get(key="k")
    assert row.status == Status.SUCCESS.value and row.pk == row.fencing_token
    assert RetryCounter.objects.filter(tenant="t", operation="op", key="f").get().count == 1
    for write in (row.save, row.delete, IdempotencyRecord.objects.all().delete,
                  lambda: IdempotencyRecord.objects.update(status="FAILED")):
        with pytest.raises(TypeError, match="written by the handler only"):
            write()


def _fail() -> Any:
    raise RuntimeError("transient")


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_models_need_no_migration_the_library_does_not_ship(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``makemigrations --check`` is clean for the app: a user's ``migrate`` never reports
    changes "not yet reflected in a migration", and ``makemigrations`` never writes into the
    installed library."""
    call_command("makemigrations", "idempotent_tasks", "--check", "--dry-run", verbosity=1)
    assert "No changes detected" in capsys.readouterr().out
