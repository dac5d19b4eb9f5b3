"""``IDEMPOTENT_TASKS`` → ``get_handler()`` (``ImproperlyConfigured`` for a bad setting), the
system checks, the middleware's own configuration errors, and ``DjangoStore``'s errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from idempotent_tasks import (
    ConfigurationError,
    IdempotencyHandler,
    MemoryStore,
    StoreUnavailableError,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.django import DjangoStore, IdempotencyMiddleware, get_handler
from idempotent_tasks.django._checks import check_configuration

from .conftest import idempotency_settings

HANDLER = IdempotencyHandler(MemoryStore(), metrics=None)


def ids(messages: list[Any]) -> list[str]:
    return sorted(m.id for m in messages)


def test_get_handler_is_built_once_from_the_settings() -> None:
    with idempotency_settings(TTL=60, LEASE_TIMEOUT=5, MAX_RETRIES=7, DATABASE="sqlite"):
        handler = get_handler()
        assert get_handler() is handler
        assert (handler.defaults.ttl, handler.defaults.lease_timeout) == (60.0, 5.0)
        assert handler.defaults.max_retries == 7 and handler.supports_transactions
    assert get_handler() is not handler  # the setting changed: a fresh one


@pytest.mark.parametrize(("changes", "message"), [
    ({"TTL": -1}, "ttl and lease_timeout must be positive"),
    ({"MAX_RETRIES": 0}, "max_retries must be at least 1"),
    ({"DATABASE": "nope"}, "'nope' is not an alias of settings.DATABASES"),
    ({"TYPO": 1}, "unknown key(s) ['TYPO']"),
    ({"CACHE": "no.such.module.cache"}, "IDEMPOTENT_TASKS['CACHE']: cannot import"),
    ({"HANDLER": "tests.django.test_settings_and_checks.HANDLER"},
     "IDEMPOTENT_TASKS['HANDLER']: excludes ['DATABASE', 'LEASE_TIMEOUT']"),
])
def test_a_bad_setting_is_improperly_configured(changes: dict[str, Any], message: str) -> None:
    with idempotency_settings(**changes):
        with pytest.raises(ImproperlyConfigured) as caught:
            get_handler()
        assert ids(check_configuration()) == ["idempotent_tasks.E001"]
    assert message in str(caught.value)


def test_handler_names_a_handler_of_the_projects_own() -> None:
    with override_settings(IDEMPOTENT_TASKS={
        "HANDLER": "tests.django.test_settings_and_checks.HANDLER",
        "HTTP": {"GET_TENANT": "tests.django.project.views.tenant_of"},
    }):
        assert get_handler() is HANDLER
        assert check_configuration() == []


def test_the_checks_pass_on_the_test_project() -> None:
    assert check_configuration() == []


@contextlib.contextmanager
def extra_databases(**extra: dict[str, Any]) -> Iterator[None]:
    """More aliases in ``settings.DATABASES`` *and* in ``django.db.connections``."""
    from django.db import connections

    databases = {**settings.DATABASES, **extra}
    with override_settings(DATABASES=databases):
        connections.settings = connections.configure_settings(databases)
        try:
            yield
        finally:
            for alias in extra:
                with contextlib.suppress(Exception):
                    connections[alias].close()
                with contextlib.suppress(Exception):
                    del connections[alias]
            connections.settings = connections.configure_settings(settings.DATABASES)


def test_an_unsupported_or_in_memory_database_is_reported() -> None:
    with extra_databases(other={"ENGINE": "django.db.backends.dummy"},
                         memory={"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}):
        with idempotency_settings(DATABASE="other"):
            assert ids(check_configuration()) == ["idempotent_tasks.E002"]
            with pytest.raises(ImproperlyConfigured, match="PostgreSQL and SQLite"):
                get_handler()
        with idempotency_settings(DATABASE="memory"):
            assert ids(check_configuration()) == ["idempotent_tasks.E003"]


def test_middleware_risks_are_reported() -> None:
    auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
    ours = "idempotent_tasks.django.IdempotencyMiddleware"
    early = [m for m in settings.MIDDLEWARE if m != ours]
    early.insert(early.index(auth), ours)
    with override_settings(MIDDLEWARE=early):
        assert ids(check_configuration()) == ["idempotent_tasks.W001"]
    no_tenant = {**settings.IDEMPOTENT_TASKS, "HTTP": {}}
    with override_settings(IDEMPOTENT_TASKS=no_tenant):
        assert ids(check_configuration()) == ["idempotent_tasks.E004"]
        with pytest.raises(ImproperlyConfigured, match="get_tenant is required"):
            IdempotencyMiddleware(lambda request: None)
    with idempotency_settings(HTTP={"PROFILE": "nope"}), pytest.raises(ImproperlyConfigured):
        IdempotencyMiddleware(lambda request: None)
    with idempotency_settings(HTTP={"GET_TENANT": "nowhere.tenant"}):
        assert ids(check_configuration()) == ["idempotent_tasks.E004"]


def test_a_heartbeat_too_close_to_the_lease_is_a_warning() -> None:
    with idempotency_settings(LEASE_TIMEOUT=10, HEARTBEAT_INTERVAL=5):
        assert ids(check_configuration()) == ["idempotent_tasks.W002"]


def test_djangostore_refuses_an_unknown_alias_and_fails_closed(
    django_db_blocker: Any, tmp_path: Any
) -> None:
    with pytest.raises(ConfigurationError, match="nope"):
        DjangoStore(using="nope")
    broken = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "no" / "x.db")}
    with extra_databases(broken=broken), django_db_blocker.unblock():
        store = DjangoStore(using="broken")
        outcome = IdempotencyHandler(store, metrics=None).run(
            lambda: "never", operation="op", tenant="t", key="k")
        assert outcome.kind == "store_unavailable" and not outcome.ran
        assert "unable to open database file" in (outcome.detail or "")
        with pytest.raises(StoreUnavailableError, match="unable to open"):
            store.get(Scope("t", "op", "k"))
