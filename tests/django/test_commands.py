"""The ``idempotency_*`` management commands, on the settings' handler (``DjangoStore``)."""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from idempotent_tasks import IdempotencyHandler, Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import EXIT_RECORD_NOT_FOUND, EXIT_USAGE
from idempotent_tasks.django import DjangoStore, get_handler


def run(name: str, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def poisoned(key: str) -> IdempotencyHandler:
    handler = get_handler()
    handler.run(_raise, operation="pay", tenant="acme", key=key, permanent=(ValueError,))
    record = handler.get_record(operation="pay", tenant="acme", key=key)
    assert record is not None and record.status is Status.FAILED
    return handler


def _raise() -> None:
    raise ValueError("declined")


def test_inspect_shows_a_record_and_exits_3_without_one(alias: str) -> None:
    get_handler().execute(lambda: {"ok": 1}, operation="pay", tenant="acme", key="k1")
    doc = json.loads(run("idempotency_inspect", "acme", "pay", "k1", "--json"))
    assert doc["status"] == "SUCCESS" and doc["response"] == {"ok": 1}
    assert "SUCCESS record" in run("idempotency_inspect", "acme", "pay", "k1")
    with pytest.raises(CommandError) as missing:
        run("idempotency_inspect", "acme", "pay", "nope")
    assert missing.value.returncode == EXIT_RECORD_NOT_FOUND
    with pytest.raises(CommandError) as invalid:
        run("idempotency_inspect", "acme", "pay", "")
    assert invalid.value.returncode == EXIT_USAGE


def test_inspect_shows_the_past_attempts(alias: str) -> None:
    handler = poisoned("k-again")
    failed = handler.get_record(operation="pay", tenant="acme", key="k-again")
    assert failed is not None
    handler.run(lambda: 2, operation="pay", tenant="acme", key="k-again",
                on_failure="allow_new_attempt")
    doc = json.loads(run("idempotency_inspect", "acme", "pay", "k-again", "--json"))
    assert [(a["fencing_token"], a["status"]) for a in doc["attempts"]] == [
        (failed.fencing_token, "FAILED")
    ]
    assert "past attempts" in run("idempotency_inspect", "acme", "pay", "k-again")


def test_unpoison_deletes_resets_and_audits(alias: str, caplog: pytest.LogCaptureFixture) -> None:
    handler = poisoned("k2")
    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        doc = json.loads(run("idempotency_unpoison", "acme", "pay", "k2", "--yes",
                             "--actor", "tester", "--json"))
    assert doc["unpoisoned"] is True and doc["actor"] == "manage.py:tester"
    assert handler.get_record(operation="pay", tenant="acme", key="k2") is None
    assert handler.retry_count(operation="pay", tenant="acme", key="k2") == 0
    audit = [r for r in caplog.records if r.getMessage().startswith("unpoisoned")]
    assert audit and "manage.py:tester" in audit[0].getMessage()
    with pytest.raises(CommandError) as gone:
        run("idempotency_unpoison", "acme", "pay", "k2", "--yes")
    assert gone.value.returncode == EXIT_RECORD_NOT_FOUND


def test_unpoison_refuses_a_record_that_is_not_failed(alias: str) -> None:
    get_handler().execute(lambda: 1, operation="pay", tenant="acme", key="k3")
    with pytest.raises(CommandError) as refused:
        run("idempotency_unpoison", "acme", "pay", "k3", "--yes")
    assert refused.value.returncode == EXIT_RECORD_NOT_FOUND


def test_recover_counts_and_releases_a_crashed_attempt(alias: str) -> None:
    store, past = DjangoStore(using=alias), time.time() - 1_000
    store.create(Scope("acme", "pay", "k4"), request_hash="h", now=past,
                 lease_expires_at=past + 30)  # a worker died holding it long ago
    plan = json.loads(run("idempotency_recover", "--dry-run", "--json"))
    assert plan["would_recover"] == 1 and "release" in plan["records"][0]["action"]
    assert json.loads(run("idempotency_recover", "--json")) == {"recovered": 1, "batches": 1}
    handler = get_handler()
    assert handler.get_record(operation="pay", tenant="acme", key="k4") is None
    assert handler.retry_count(operation="pay", tenant="acme", key="k4") == 1
    assert "recovered 0 stuck record(s)" in run("idempotency_recover")


def test_cleanup_purges_expired_records(alias: str) -> None:
    store, past = DjangoStore(using=alias), time.time() - 1_000
    created = store.create(Scope("acme", "pay", "k5"), request_hash="h", now=past,
                           lease_expires_at=past + 30)
    store.mark_success(Scope("acme", "pay", "k5"), token=created.record.fencing_token,
                       response=b"1", now=past, expires_at=past + 1)
    preview = json.loads(run("idempotency_cleanup", "--dry-run", "--json"))
    assert preview["would_purge"] == 1
    assert json.loads(run("idempotency_cleanup", "--json"))["purged"] == 1
    assert store.get(Scope("acme", "pay", "k5")) is None


def test_migrate_runs_the_apps_migrations(alias: str) -> None:
    assert f"schema ready: database {alias!r}" in run("idempotency_migrate")
