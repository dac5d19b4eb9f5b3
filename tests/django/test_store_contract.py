"""The store contract suite (``tests/stores/test_store_contract.py``) on ``DjangoStore``,
PostgreSQL and SQLite: its test functions, collected here unchanged, with this module's
``store`` fixture (copy-free: a new contract test runs here too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idempotent_tasks.django import DjangoStore
from tests.stores import test_store_contract as contract

globals().update({name: fn for name, fn in vars(contract).items() if name.startswith("test_")})


@pytest.fixture
def store(alias: str) -> Iterator[DjangoStore]:
    """A ``DjangoStore`` on the test database (flushed after each test by pytest-django)."""
    yield DjangoStore(using=alias)
