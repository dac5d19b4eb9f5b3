from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import MemoryStore
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock

from ._private_postgres import private_postgres, scram_postgres  # noqa: F401  (private clusters)
from ._services import POSTGRES_URL, REDIS_URL, require
from ._wait import SCALE

#: pytest-timeout's limit for a test without its own marker (pyproject.toml's ``timeout``).
DEFAULT_TEST_TIMEOUT = 300

STORE_KINDS = ["memory", "sqlite", "postgres", "redis", "mysql", "dynamodb"]


def unique_prefix(base: str = "t") -> str:
    return f"{base}_{uuid.uuid4().hex[:10]}"


def make_store(kind: str, tmp_path: Path) -> Store:
    """A fresh, isolated store of ``kind`` with its schema created."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        from idempotent_tasks import SQLStore

        sql = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}")
        sql.create_schema()
        return sql
    if kind == "postgres":
        require("postgres")
        from idempotent_tasks import SQLStore

        pg = SQLStore(POSTGRES_URL, table_prefix=unique_prefix("it"))
        pg.create_schema()
        return pg
    if kind == "redis":
        require("redis")
        from idempotent_tasks import RedisStore

        rs = RedisStore(REDIS_URL, prefix=unique_prefix("it"))
        rs.create_schema()
        return rs
    if kind in ("mysql", "dynamodb"):  # MariaDB and moto_server: tests/stores/_backends.py
        from .stores import _backends

        made: Store = (
            _backends.make_mysql_store() if kind == "mysql" else _backends.make_dynamodb_store()
        )
        return made
    raise ValueError(kind)


def drop_store(store: Store) -> None:
    drop = getattr(store, "drop_schema", None)
    if callable(drop):
        drop()
    store.close()


@contextlib.contextmanager
def store_of_kind(kind: str, tmp_path: Path, base: str = "t") -> Iterator[Any]:
    """A fresh store of ``kind``: a sync one (``STORE_KINDS``), or an async one living on a
    loop thread of its own (``ASYNC_STORE_KINDS``); dropped afterwards."""
    from ._async_stores import ASYNC_STORE_KINDS, async_store_on_a_loop

    if kind in ASYNC_STORE_KINDS:
        with async_store_on_a_loop(kind, unique_prefix(base)) as (inner, _):
            yield inner
        return
    made = make_store(kind, tmp_path)
    try:
        yield made
    finally:
        drop_store(made)


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """A store-contract rule exported as a plain function (``RULES`` of
    tests/stores/test_store_contract.py) runs where a suite imports it, not in the module
    that exports it: there the ``StoreContract`` subclasses run every rule."""
    home = getattr(obj, "contract_rule_of", None)
    if home is not None and isinstance(collector, pytest.Module) and collector.obj.__name__ == home:
        return []
    return None


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Store]:
    s = make_store(store_kind, tmp_path)
    try:
        yield s
    finally:
        drop_store(s)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """pytest-timeout's limits scale with the test budget (``tests/_wait.py``), like every
    deadline inside the tests: a loaded machine gets proportionally more time."""
    if SCALE == 1:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = marker.args[0] if marker is not None and marker.args else DEFAULT_TEST_TIMEOUT
        item.add_marker(pytest.mark.timeout(float(seconds) * SCALE), append=False)
