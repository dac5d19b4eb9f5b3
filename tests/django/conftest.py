"""pytest-django for ``tests/django`` only: this conftest configures Django (the test
project's settings, via ``settings.configure`` — no ``DJANGO_SETTINGS_MODULE`` is exported, so
nothing else in the suite, and no worker subprocess of another test, sees Django
configured).  Every test that touches a database is a ``transactional_db`` test (real commits:
the store's claims must commit on their own), on PostgreSQL (``default``) and SQLite
(``sqlite``); pytest-django creates and drops both test databases.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.conf import settings

from tests._services import require

if not settings.configured:
    from .project import settings as project_settings

    settings.configure(**{k: getattr(project_settings, k) for k in dir(project_settings)
                          if k.isupper()})
    django.setup()

#: The two databases every DjangoStore test runs on.
ALIASES = ("default", "sqlite")


def on_databases(*aliases: str) -> list[Any]:
    """``pytest.param`` per alias, each a ``transactional_db`` test on that database only."""
    return [
        pytest.param(alias, id="postgres" if alias == "default" else alias,
                     marks=pytest.mark.django_db(transaction=True, databases=[alias]))
        for alias in aliases or ALIASES
    ]


@pytest.fixture(params=on_databases())
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database of this test run: the idempotency ``DATABASE`` (and, through the test
    project's router, where the ``orders`` rows go)."""
    name: str = request.param
    if name == "default":
        require("postgres")
    with idempotency_settings(DATABASE=name):
        yield name


@contextlib.contextmanager
def idempotency_settings(**changes: Any) -> Iterator[None]:
    """``IDEMPOTENT_TASKS`` with ``changes`` (``HTTP`` merged key by key)."""
    from django.test import override_settings

    current = dict(settings.IDEMPOTENT_TASKS)
    http = {**current.get("HTTP", {}), **changes.pop("HTTP", {})}
    with override_settings(IDEMPOTENT_TASKS={**current, **changes, "HTTP": http}):
        yield
