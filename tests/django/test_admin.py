"""The records admin: read-only list and detail, filters, search, the audited unpoison
action and its permission (users live in ``default``; the records on the test's database)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from idempotent_tasks import ErrorCode, IdempotencyHandler, Poison, Reconciled, Status
from idempotent_tasks.django import _settings, get_handler
from idempotent_tasks.django.models import IdempotencyRecord
from idempotent_tasks.testing import FakeClock, simulate_crash

from .conftest import idempotency_settings

LIST = "/admin/idempotent_tasks/idempotencyrecord/"


@pytest.fixture(params=[
    pytest.param("default", id="postgres",
                 marks=pytest.mark.django_db(transaction=True, databases=["default"])),
    pytest.param("sqlite", id="sqlite",
                 marks=pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])),
])
def records(request: pytest.FixtureRequest) -> Iterator[IdempotencyHandler]:
    """Three records: SUCCESS (an HTTP-like response), FAILED (poisoned) and another tenant's."""
    with idempotency_settings(DATABASE=request.param):
        handler = get_handler()
        handler.execute(lambda: {"order": 7, "note": "café"}, operation="orders.charge",
                        tenant="acme", key="key-success")
        handler.run(_declined, operation="orders.charge", tenant="acme", key="key-failed",
                    permanent=(ValueError,))
        handler.execute(lambda: 1, operation="orders.refund", tenant="globex", key="key-other")
        yield handler


def _declined() -> None:
    raise ValueError("declined")


def staff(*permissions: str) -> Client:
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def keys_listed(response: Any) -> set[str]:
    html = response.content.decode()
    return {k for k in ("key-success", "key-failed", "key-other") if k in html}


def test_the_list_filters_by_status_operation_and_tenant_and_searches_keys(
    records: IdempotencyHandler,
) -> None:
    client = superuser()
    assert keys_listed(client.get(LIST)) == {"key-success", "key-failed", "key-other"}
    assert keys_listed(client.get(LIST, {"status__exact": "FAILED"})) == {"key-failed"}
    assert keys_listed(client.get(LIST, {"operation": "orders.refund"})) == {"key-other"}
    assert keys_listed(client.get(LIST, {"tenant": "acme"})) == {"key-success", "key-failed"}
    assert keys_listed(client.get(LIST, {"q": "succ"})) == {"key-success"}


def test_the_detail_is_read_only_and_decodes_the_response(records: IdempotencyHandler) -> None:
    client = superuser()
    row = IdempotencyRecord.objects.get(key="key-success")
    page = client.get(f"{LIST}{row.pk}/change/")
    html = unescape(page.content.decode())
    assert page.status_code == 200 and "café" in html and '"order": 7' in html
    assert 'name="_save"' not in html  # nothing to save: view only
    assert client.get(f"{LIST}add/").status_code == 403
    assert client.post(f"{LIST}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert IdempotencyRecord.objects.filter(key="key-success").exists()


def test_the_detail_shows_the_past_attempts(records: IdempotencyHandler) -> None:
    client = superuser()
    scope = {"operation": "orders.charge", "tenant": "acme", "key": "key-failed"}
    row = IdempotencyRecord.objects.get(key="key-failed")
    assert "fencing token</th>" not in client.get(f"{LIST}{row.pk}/change/").content.decode()
    poisoned = records.get_record(**scope)
    assert poisoned is not None

    def declined_again() -> None:
        raise Poison(result="<b>still declined</b>")

    records.run(declined_again, on_failure="allow_new_attempt", **scope)
    assert records.run(lambda: 1, on_failure="allow_new_attempt", **scope).kind == "executed"
    row = IdempotencyRecord.objects.get(key="key-failed")  # the new attempt's row
    html = client.get(f"{LIST}{row.pk}/change/").content.decode()
    assert "fencing token</th>" in html
    assert f"<td>{poisoned.fencing_token}</td><td>FAILED</td>" in html
    assert "&lt;b&gt;still declined&lt;/b&gt;" in html and "<b>still" not in html


def test_unpoison_deletes_the_failed_record_audited_and_skips_the_rest(
    records: IdempotencyHandler, caplog: pytest.LogCaptureFixture
) -> None:
    client = superuser()
    selected = [str(r.pk) for r in IdempotencyRecord.objects.filter(tenant="acme")]
    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        page = client.post(LIST, {"action": "unpoison", "_selected_action": selected},
                           follow=True)
    shown = [str(m) for m in page.context["messages"]]
    assert shown == ["unpoisoned 1 record(s) as django-admin:root; 1 skipped (not FAILED)"], shown
    assert records.get_record(operation="orders.charge", tenant="acme", key="key-failed") is None
    assert records.retry_count(operation="orders.charge", tenant="acme", key="key-failed") == 0
    kept = records.get_record(operation="orders.charge", tenant="acme", key="key-success")
    assert kept is not None and kept.status is Status.SUCCESS
    audit = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unpoisoned")]
    assert len(audit) == 1 and "django-admin:root" in audit[0]


def test_unpoison_works_under_atomic_requests(records: IdempotencyHandler) -> None:
    """``ATOMIC_REQUESTS`` wraps views in a transaction, where the store refuses to write:
    the list page (and its action) is left out of it."""
    from django.db import connections

    alias = _settings.database_alias()
    failed = IdempotencyRecord.objects.get(key="key-failed")
    connections.settings[alias]["ATOMIC_REQUESTS"] = True
    try:
        superuser().post(LIST, {"action": "unpoison", "_selected_action": [str(failed.pk)]})
    finally:
        connections.settings[alias]["ATOMIC_REQUESTS"] = False
    assert not IdempotencyRecord.objects.filter(key="key-failed").exists()


def test_unpoison_needs_its_permission(records: IdempotencyHandler) -> None:
    failed = IdempotencyRecord.objects.get(key="key-failed")
    viewer = staff("view_idempotencyrecord")
    assert viewer.get(LIST).status_code == 200
    assert 'value="unpoison"' not in viewer.get(LIST).content.decode()
    viewer.post(LIST, {"action": "unpoison", "_selected_action": [str(failed.pk)]})
    assert IdempotencyRecord.objects.filter(key="key-failed").exists()  # refused
    User.objects.filter(username="clerk").delete()
    allowed = staff("view_idempotencyrecord", "unpoison_idempotencyrecord")
    assert 'value="unpoison"' in allowed.get(LIST).content.decode()
    allowed.post(LIST, {"action": "unpoison", "_selected_action": [str(failed.pk)]})
    assert not IdempotencyRecord.objects.filter(key="key-failed").exists()


# ---------------------------------------------------------------- resolving UNCERTAIN records
UNCERTAIN_KEY = "key-uncertain"


@pytest.fixture
def uncertain(records: IdempotencyHandler) -> IdempotencyHandler:
    """An UNCERTAIN record beside the three: a crashed attempt (on a clock of the test's
    own, moved past its lease) whose ``reconcile`` could not tell."""
    from idempotent_tasks.django import DjangoStore

    store = DjangoStore(using=_settings.database_alias())
    clock = FakeClock(time.time())
    crashing = IdempotencyHandler(store, clock=clock, metrics=None)
    scope = {"operation": "orders.charge", "tenant": "acme", "key": UNCERTAIN_KEY}
    simulate_crash(crashing, **scope, lease_timeout=5)
    clock.advance(6)
    outcome = crashing.run(lambda: "charged twice", **scope, on_stuck="reconcile",
                           reconcile=lambda ctx: Reconciled.unknown("processor says pending"))
    assert outcome.error_code == ErrorCode.OUTCOME_UNCERTAIN, outcome
    return records


def _status_of(handler: IdempotencyHandler, key: str) -> Status | None:
    record = handler.get_record(operation="orders.charge", tenant="acme", key=key)
    return None if record is None else record.status


def _acme() -> list[str]:
    return [str(r.pk) for r in IdempotencyRecord.objects.filter(tenant="acme")]


@pytest.mark.parametrize(("action", "after", "next_kind"), [
    ("resolve_retry", None, "executed"),
    ("resolve_fail", Status.FAILED, "poisoned"),
])
def test_resolve_retry_and_fail_settle_the_uncertain_record_audited(
    uncertain: IdempotencyHandler, caplog: pytest.LogCaptureFixture, action: str,
    after: Status | None, next_kind: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        page = superuser().post(LIST, {"action": action, "_selected_action": _acme()},
                                follow=True)
    resolution = action.removeprefix("resolve_")
    shown = [str(m) for m in page.context["messages"]]
    assert shown == [f"resolved 1 record(s) as {resolution} by django-admin:root; "
                     "2 skipped (not UNCERTAIN)"], shown
    assert _status_of(uncertain, UNCERTAIN_KEY) == after
    assert _status_of(uncertain, "key-success") is Status.SUCCESS
    assert _status_of(uncertain, "key-failed") is Status.FAILED
    audit = [r for r in caplog.records if r.getMessage().startswith("uncertain_resolved")]
    assert len(audit) == 1
    fields = audit[0].idempotency  # type: ignore[attr-defined]
    assert (fields["by"], fields["resolution"], fields["key"]) == (
        "django-admin:root", resolution, UNCERTAIN_KEY)
    outcome = uncertain.run(lambda: "ran again", operation="orders.charge", tenant="acme",
                            key=UNCERTAIN_KEY)
    assert outcome.kind == next_kind


def test_resolve_done_asks_for_the_result_on_an_intermediate_page(
    uncertain: IdempotencyHandler,
) -> None:
    client = superuser()
    selected = _acme()
    page = client.post(LIST, {"action": "resolve_done", "_selected_action": selected})
    html = unescape(page.content.decode())
    assert page.status_code == 200 and 'name="result"' in html
    assert f"acme / orders.charge / {UNCERTAIN_KEY} — UNCERTAIN" in html
    assert "key-success — SUCCESS (left alone)" in html
    assert _status_of(uncertain, UNCERTAIN_KEY) is Status.UNCERTAIN  # nothing yet

    bad = client.post(LIST, {"action": "resolve_done", "_selected_action": selected,
                             "apply": "yes", "result": "{not json"})
    assert bad.status_code == 200 and "not JSON" in bad.content.decode()
    assert _status_of(uncertain, UNCERTAIN_KEY) is Status.UNCERTAIN

    done = client.post(LIST, {"action": "resolve_done", "_selected_action": selected,
                              "apply": "yes", "result": '{"charged": 100}'}, follow=True)
    shown = [str(m) for m in done.context["messages"]]
    assert shown == ["resolved 1 record(s) as done by django-admin:root; "
                     "2 skipped (not UNCERTAIN)"], shown
    replayed = uncertain.run(lambda: "charged twice", operation="orders.charge", tenant="acme",
                             key=UNCERTAIN_KEY)
    assert (replayed.kind, replayed.result) == ("replayed", {"charged": 100})


def test_resolve_done_without_an_uncertain_record_selected_asks_nothing(
    uncertain: IdempotencyHandler,
) -> None:
    failed = IdempotencyRecord.objects.get(key="key-failed")
    page = superuser().post(LIST, {"action": "resolve_done",
                                   "_selected_action": [str(failed.pk)]}, follow=True)
    assert 'name="result"' not in page.content.decode()
    assert [str(m) for m in page.context["messages"]] == [
        "none of the selected records is UNCERTAIN: nothing to resolve"]
    assert _status_of(uncertain, "key-failed") is Status.FAILED


def test_an_uncertain_records_detail_shows_why(uncertain: IdempotencyHandler) -> None:
    client = superuser()
    row = IdempotencyRecord.objects.get(key=UNCERTAIN_KEY)
    html = unescape(client.get(f"{LIST}{row.pk}/change/").content.decode())
    assert "uncertain, no result yet: processor says pending" in html
    listed = client.get(LIST, {"status__exact": "UNCERTAIN"})
    assert keys_listed(listed) == set() and UNCERTAIN_KEY in listed.content.decode()


def test_resolve_needs_its_permission(uncertain: IdempotencyHandler) -> None:
    row = IdempotencyRecord.objects.get(key=UNCERTAIN_KEY)
    unpoisoner = staff("view_idempotencyrecord", "unpoison_idempotencyrecord")
    listed = unpoisoner.get(LIST).content.decode()
    assert 'value="unpoison"' in listed and 'value="resolve_retry"' not in listed
    for action in ("resolve_done", "resolve_retry", "resolve_fail"):
        unpoisoner.post(LIST, {"action": action, "_selected_action": [str(row.pk)],
                               "apply": "yes", "result": "1"})
    assert _status_of(uncertain, UNCERTAIN_KEY) is Status.UNCERTAIN  # refused
    User.objects.filter(username="clerk").delete()
    resolver = staff("view_idempotencyrecord", "resolve_idempotencyrecord")
    listed = resolver.get(LIST).content.decode()
    assert 'value="resolve_retry"' in listed and 'value="unpoison"' not in listed
    resolver.post(LIST, {"action": "resolve_fail", "_selected_action": [str(row.pk)]})
    assert _status_of(uncertain, UNCERTAIN_KEY) is Status.FAILED
