"""pytest fixtures for testing your own idempotent tasks (the ``pytest11`` entry point
``idempotent_tasks``: pytest loads it whenever the package is installed).

* ``idempotency_clock``: a :class:`~idempotent_tasks.testing.FakeClock`, the clock of
  ``idempotency_handler`` (leases, ttl and recovery move only when the test advances it).
* ``idempotency_store``: a store of the test's own.  In-process memory by default; with
  ``--idempotency-store URL`` (or the ini option ``idempotency_store``) the same suite runs
  against SQLite, PostgreSQL or Redis — each test under a fresh table / key prefix that is
  dropped, records and all, when it ends.
* ``idempotency_handler``: an :class:`~idempotent_tasks.IdempotencyHandler` on both (no
  metrics); ``@pytest.mark.idempotency(lease_timeout=5, max_retries=2, ...)`` passes other
  handler options.

The assertions (``assert_ran_once``, ``records``) are plain functions in
:mod:`idempotent_tasks.testing`.  The fixtures sit beside Celery's ``celery.contrib.pytest``
fixtures and pytest-celery's without sharing a name with either.  Nothing here runs unless a
test asks for a fixture: no autouse fixture, no per-test hook, and no store, driver or
framework is imported before then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._core.handler import IdempotencyHandler
    from .stores.base import Store
    from .testing import FakeClock

# StoreContract's rules (idempotent_tasks.testing) are plain asserts in a package module:
# have pytest rewrite them as it does a test's, so a broken store's failure explains itself.
# This marks the module's name only; nothing is imported.
pytest.register_assert_rewrite("idempotent_tasks._store_contract")

STORE_OPTION = "--idempotency-store"
STORE_INI = "idempotency_store"
MARKER = "idempotency"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("idempotent-tasks")
    group.addoption(
        STORE_OPTION, dest="idempotency_store_url", metavar="URL", default=None,
        help="Run the idempotency_store fixture on this store (sqlite:///file.db, "
             "postgresql+psycopg://…, redis://…) instead of memory; each test gets its own "
             "prefix, dropped afterwards.",
    )
    parser.addini(STORE_INI, help=f"Default for {STORE_OPTION}.", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**options): IdempotencyHandler options for the idempotency_handler "
        "fixture (lease_timeout=, max_retries=, ttl=, on_stuck=, ...)",
    )


def store_url(config: pytest.Config) -> str | None:
    """The store URL the suite runs on: the command line's, else the ini file's, else
    ``None`` (memory)."""
    url: str | None = config.getoption("idempotency_store_url")
    if url:
        return url
    ini: str | None = config.getini(STORE_INI) or None
    return ini


@pytest.fixture
def idempotency_clock() -> FakeClock:
    """The fake clock wired into ``idempotency_handler``: ``idempotency_clock.advance(s)``."""
    from .testing import FakeClock

    return FakeClock()


@pytest.fixture
def idempotency_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A store of this test's own (module docstring); dropped when the test ends."""
    from .testing import isolated_store

    with isolated_store(store_url(request.config)) as store:
        yield store


@pytest.fixture
def idempotency_handler(
    request: pytest.FixtureRequest, idempotency_store: Store, idempotency_clock: FakeClock
) -> Iterator[IdempotencyHandler]:
    """An ``IdempotencyHandler`` on ``idempotency_store`` with ``idempotency_clock``."""
    from ._core.handler import IdempotencyHandler

    options: dict[str, Any] = {"metrics": None, "clock": idempotency_clock}
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None:
        options.update(marker.kwargs)
    handler = IdempotencyHandler(idempotency_store, **options)
    try:
        yield handler
    finally:
        handler.close()
