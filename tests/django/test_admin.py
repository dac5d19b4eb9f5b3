"""The records admin: read-only list and detail, filters, search, the audited unpoison
action and its permission (users live in ``default``; the records on the test's database)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from idempotent_tasks import IdempotencyHandler, Status
from idempotent_tasks.django import get_handler
from idempotent_tasks.django.models import IdempotencyRecord

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

    from idempotent_tasks.django import _settings

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
