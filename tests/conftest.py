from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent_tasks import MemoryStore
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock

from ._private_postgres import private_postgres  # noqa: F401  (the session's own cluster)
from ._services import POSTGRES_URL, REDIS_URL, require

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
