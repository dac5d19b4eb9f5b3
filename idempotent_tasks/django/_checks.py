"""System checks (``manage.py check``, and every ``runserver``/``migrate``) for the
configuration risks that would otherwise show only under failure.

==========================  ==================================================================
id                          what
==========================  ==================================================================
idempotent_tasks.E001       ``IDEMPOTENT_TASKS`` is invalid (an unknown key, a bad value, an
                            import that fails): the handler cannot be built
idempotent_tasks.E002       the ``DATABASE`` is not PostgreSQL or SQLite
idempotent_tasks.E003       the ``DATABASE`` is an in-memory SQLite database: private to one
                            connection, so every thread (heartbeats, workers) sees its own
idempotent_tasks.E004       ``IdempotencyMiddleware`` is installed without ``HTTP["GET_TENANT"]``
                            (or its ``HTTP`` options are invalid)
idempotent_tasks.W001       ``IdempotencyMiddleware`` comes before ``AuthenticationMiddleware``:
                            ``request.user`` is not set yet when the tenant is resolved
idempotent_tasks.W002       a ``HEARTBEAT_INTERVAL`` not well below ``LEASE_TIMEOUT``: a live
                            attempt's lease may expire between two heartbeats and be taken
                            over while it runs
==========================  ==================================================================
"""

from __future__ import annotations

from typing import Any, Final

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import _settings
from ._schema import SUPPORTED_VENDORS

MIDDLEWARE: Final = "idempotent_tasks.django.IdempotencyMiddleware"
_AUTH: Final = "django.contrib.auth.middleware.AuthenticationMiddleware"
_MEMORY_NAMES: Final = ("", ":memory:")


def check_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        config = _settings.raw_settings()
        if "HANDLER" not in config:
            _settings.database_alias()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="idempotent_tasks.E001")]
    found = _database_problems(config)
    if not found:
        try:
            _settings.get_handler()
        except ImproperlyConfigured as exc:
            found.append(checks.Error(str(exc), id="idempotent_tasks.E001"))
    return [*found, *_middleware_problems(), *_lease_problems(config)]


def _database_problems(config: Any) -> list[checks.CheckMessage]:
    if "HANDLER" in config:
        return []
    alias = _settings.database_alias()
    vendor = connections[alias].vendor  # read from settings: nothing connects
    if vendor not in SUPPORTED_VENDORS:
        return [checks.Error(
            f"IDEMPOTENT_TASKS['DATABASE'] {alias!r} is a {vendor} database: DjangoStore "
            "supports PostgreSQL and SQLite", id="idempotent_tasks.E002",
        )]
    name = str(settings.DATABASES[alias].get("NAME") or "")
    if vendor == "sqlite" and (name in _MEMORY_NAMES or "mode=memory" in name):
        return [checks.Error(
            f"IDEMPOTENT_TASKS['DATABASE'] {alias!r} is an in-memory SQLite database: "
            "each connection has its own, so use a file", id="idempotent_tasks.E003",
        )]
    return []


def _middleware_problems() -> list[checks.CheckMessage]:
    installed = list(getattr(settings, "MIDDLEWARE", None) or [])
    if MIDDLEWARE not in installed:
        return []
    found: list[checks.CheckMessage] = []
    try:
        http = _settings.http_options()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="idempotent_tasks.E004")]
    if http.get("get_tenant") is None:
        found.append(checks.Error(
            "IdempotencyMiddleware needs IDEMPOTENT_TASKS['HTTP']['GET_TENANT']: the dotted "
            "path of fn(request) -> tenant", id="idempotent_tasks.E004",
        ))
    if _AUTH in installed and installed.index(_AUTH) > installed.index(MIDDLEWARE):
        found.append(checks.Warning(
            "IdempotencyMiddleware comes before AuthenticationMiddleware: request.user is not "
            "set when GET_TENANT runs", hint="move it after AuthenticationMiddleware",
            id="idempotent_tasks.W001",
        ))
    return found


def _lease_problems(config: Any) -> list[checks.CheckMessage]:
    interval, lease = config.get("HEARTBEAT_INTERVAL"), config.get("LEASE_TIMEOUT", 300.0)
    if not isinstance(interval, int | float) or not isinstance(lease, int | float):
        return []
    if interval * 3 > lease:
        return [checks.Warning(
            f"HEARTBEAT_INTERVAL {interval} is more than a third of LEASE_TIMEOUT {lease}: "
            "one slow heartbeat lets a live attempt's lease expire and be taken over",
            id="idempotent_tasks.W002",
        )]
    return []


__all__ = ["MIDDLEWARE", "check_configuration"]
