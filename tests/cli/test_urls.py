"""store_from_url: one URL setting picks the backend and passes the prefix on."""

from __future__ import annotations

from pathlib import Path

import pytest

from idempotent_tasks import ConfigurationError, MemoryStore
from idempotent_tasks.stores.urls import redact_url, store_from_url, url_scheme


def test_memory_urls() -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    assert store_from_url("memory://") is not store_from_url("memory://")
    shared = store_from_url("memory://shared-a")
    assert store_from_url("memory://shared-a") is shared
    assert store_from_url("memory://shared-b") is not shared
    assert isinstance(store_from_url("memory://", prefix="ignored"), MemoryStore)
    with pytest.raises(ConfigurationError):
        store_from_url("memory://", pool_size=3)


def test_sql_urls_get_table_prefix_under_either_name(tmp_path: Path) -> None:
    from idempotent_tasks import SQLStore

    url = f"sqlite:///{tmp_path / 'x.db'}"
    default = store_from_url(url)
    assert isinstance(default, SQLStore) and default.name == "sqlite"
    assert store_from_url(url, table_prefix="a_b").table_prefix == "a_b"  # type: ignore[attr-defined]
    assert store_from_url(url, prefix="c_d").table_prefix == "c_d"  # type: ignore[attr-defined]
    assert store_from_url(url, table_prefix=None).table_prefix == default.table_prefix  # type: ignore[attr-defined]
    pg = store_from_url("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    assert pg.name == "postgresql"
    assert store_from_url("postgresql://u@127.0.0.1:1/db").name == "postgresql"
    with pytest.raises(ConfigurationError):
        store_from_url(url, table_prefix="a", prefix="b")
    with pytest.raises(ConfigurationError):
        store_from_url(url, table_prefix="bad-prefix!")


def test_redis_urls_get_prefix_under_either_name() -> None:
    from idempotent_tasks import RedisStore

    store = store_from_url("redis://127.0.0.1:1/0", table_prefix="p1")
    assert isinstance(store, RedisStore) and store.prefix == "p1"
    assert store_from_url("rediss://127.0.0.1:1/0", prefix="p2").prefix == "p2"  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError):
        store_from_url("redis://127.0.0.1:1/0", prefix="{bad}")


def test_unknown_or_malformed_urls() -> None:
    with pytest.raises(ConfigurationError, match="unknown store URL scheme 'mongodb'"):
        store_from_url("mongodb://root:pw@localhost/x")
    with pytest.raises(ConfigurationError, match="not a store URL"):
        store_from_url("idempotency.db")


def test_url_scheme_and_redaction() -> None:
    assert url_scheme("postgresql+psycopg://x") == "postgresql"
    assert url_scheme("REDIS://x") == "redis"
    assert url_scheme("redis+cluster://x") == "redis+cluster"
    assert redact_url("postgresql://user:s3cret@db:5432/app") == "postgresql://user:***@db:5432/app"
    assert redact_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"
    assert "s3cret" not in redact_url("postgresql://user:s3cret@db/app")
