"""Fixtures for the HTTP middleware tests: every test body runs against the memory store, a
SQLite file, and the real PostgreSQL (SQLStore) and Redis (RedisStore) stores, isolated by a
unique prefix (SQLite: a file in the test's own directory)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks.stores.base import Store

from ..conftest import drop_store, make_store
from ._apps import ASGIDriver, Script, WSGIDriver, fastapi_app, flask_app

HTTP_STORE_KINDS = ["memory", "sqlite", "postgres", "redis"]


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


@pytest.fixture(params=["asgi", "wsgi"])
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``make(handler, script, **middleware_options)`` → a driver for FastAPI (ASGI, httpx)
    or Flask (WSGI, its test client): every test using it runs on both."""

    def build(handler: IdempotencyHandler, script: Script, **options: Any) -> Any:
        if request.param == "asgi":
            return ASGIDriver(fastapi_app(handler, script, **options))
        return WSGIDriver(flask_app(handler, script, **options))

    return build
