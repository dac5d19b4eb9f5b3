"""Fixtures for the HTTP middleware tests: every test body runs against the memory store and
the real PostgreSQL (SQLStore) and Redis (RedisStore) stores, isolated by a unique prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks.stores.base import Store

from ..conftest import drop_store, make_store

HTTP_STORE_KINDS = ["memory", "postgres", "redis"]


@pytest.fixture(params=HTTP_STORE_KINDS)
def http_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    store = make_store(request.param, tmp_path)
    try:
        yield store
    finally:
        drop_store(store)


@pytest.fixture
def handler(http_store: Store) -> IdempotencyHandler:
    return IdempotencyHandler(http_store, metrics=None, outcome_retry_timeout=1.0)
