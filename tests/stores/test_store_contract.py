"""The store contract on every built-in store: ``idempotent_tasks.testing.StoreContract``, the
suite users run on their own stores, subclassed once per store kind.

Sync kinds give the class a ``store`` (``tests/conftest.py`` ``make_store``); async kinds an
``async_store``, whose coroutines the class runs on a loop of its own.  A kind whose service is
missing skips locally and fails under ``CI=true`` (``tests/_services.py`` ``require``).  The
PgBouncer kinds run the SQL stores with ``prepare=False`` through a transaction-mode PgBouncer
(``.ci/services.sh`` starts it).

Suites written before ``StoreContract`` (the Redis Cluster, DjangoStore and tracing suites)
reuse the rules from here as plain functions ``test_…(store)`` and the ``store`` fixture over
every kind: see the end of the module.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks._store_contract._common import NOW, claim
from idempotent_tasks._store_contract._face import blocking
from idempotent_tasks.stores import Scope, Store
from idempotent_tasks.testing import StoreContract

from .._async_stores import ASYNC_STORE_KINDS, asyncpg_url, new_async_store
from .._services import PGBOUNCER_URL, require
from .._wait import budget
from ..conftest import STORE_KINDS, drop_store, make_store, unique_prefix


@contextlib.contextmanager
def sync_store(kind: str, tmp_path: Path) -> Iterator[Store]:
    """A fresh, isolated store of ``kind``, dropped afterwards."""
    made = make_store(kind, tmp_path)
    try:
        yield made
    finally:
        drop_store(made)


def sync_kind(kind: str) -> Any:
    """The ``store`` fixture of a sync store kind."""

    @pytest.fixture
    def store(self: Any, tmp_path: Path) -> Iterator[Store]:
        with sync_store(kind, tmp_path) as made:
            yield made

    return store


def async_kind(kind: str) -> Any:
    """The ``async_store`` fixture of an async store kind (``StoreContract`` creates its
    schema, drops it and closes it, on its own loop)."""

    @pytest.fixture
    def async_store(self: Any) -> Any:
        return new_async_store(kind, unique_prefix("ac"))

    return async_store


class TestMemoryStore(StoreContract):
    store = sync_kind("memory")


class TestSQLiteStore(StoreContract):
    store = sync_kind("sqlite")


class TestPostgresStore(StoreContract):
    store = sync_kind("postgres")


class TestRedisStore(StoreContract):
    store = sync_kind("redis")


class TestMySQLStore(StoreContract):
    store = sync_kind("mysql")


class TestDynamoDBStore(StoreContract):
    store = sync_kind("dynamodb")


class TestAsyncPostgresStore(StoreContract):
    async_store = async_kind("async_postgres")


class TestAsyncPostgresStoreOnAsyncpg(StoreContract):
    async_store = async_kind("async_postgres_asyncpg")


class TestAsyncRedisStore(StoreContract):
    async_store = async_kind("async_redis")


# -- PostgreSQL behind PgBouncer in transaction mode: no named prepared statements ----------
def pgbouncer_store(prefix: str) -> Any:
    require("pgbouncer")
    from idempotent_tasks import SQLStore

    return SQLStore(PGBOUNCER_URL, prepare=False, table_prefix=prefix)


def pgbouncer_async_store(prefix: str, url: str = PGBOUNCER_URL) -> Any:
    require("pgbouncer")
    from idempotent_tasks import AsyncSQLStore

    return AsyncSQLStore(url, prepare=False, table_prefix=prefix)


class TestPostgresStoreBehindPgBouncer(StoreContract):
    @pytest.fixture
    def store(self) -> Iterator[Store]:
        made = pgbouncer_store(unique_prefix("pgb"))
        made.create_schema()
        try:
            yield made
        finally:
            drop_store(made)


class TestAsyncPostgresStoreBehindPgBouncer(StoreContract):
    @pytest.fixture
    def async_store(self) -> Any:
        return pgbouncer_async_store(unique_prefix("apgb"))


class TestAsyncpgStoreBehindPgBouncer(StoreContract):
    @pytest.fixture
    def async_store(self) -> Any:
        return pgbouncer_async_store(unique_prefix("aapgb"), asyncpg_url(PGBOUNCER_URL))


def pgbouncer_setting(name: str) -> str:
    """One setting of the PgBouncer on PGBOUNCER_URL, read on its admin console."""
    from sqlalchemy.engine import make_url

    url = make_url(PGBOUNCER_URL)
    out = subprocess.run(
        ["psql", "-h", url.host or "127.0.0.1", "-p", str(url.port or 6432), "-U",
         url.username or "postgres", "-d", "pgbouncer", "-Atc", "SHOW CONFIG"],
        capture_output=True, text=True, timeout=budget(30), check=True,
    ).stdout
    return {line.split("|")[0]: line.split("|")[1] for line in out.splitlines()}[name]


class TestThroughPgBouncer:
    """(A class, so that the suites that copy this module's ``test_…`` functions leave it.)"""

    def test_pgbouncer_pools_by_transaction(self) -> None:
        """The PgBouncer kinds prove something only if a server connection is shared between
        clients transaction by transaction, where a named prepared statement breaks."""
        require("pgbouncer")
        assert pgbouncer_setting("pool_mode") == "transaction"

    def test_create_schema_works_through_pgbouncer(self) -> None:
        prefix = unique_prefix("pgs")
        first, second = pgbouncer_store(prefix), pgbouncer_store(prefix)
        try:
            first.create_schema()
            second.create_schema()  # idempotent, from another pool on other server connections
            scope = Scope("acme", "pgbouncer.schema", "k-1")
            assert claim(first, scope).created
            assert second.get(scope) is not None
        finally:
            second.close()
            drop_store(first)

    def test_async_create_schema_works_through_pgbouncer(self) -> None:
        prefix = unique_prefix("apgs")
        with blocking(pgbouncer_async_store(prefix)) as store:  # awaits create_schema() once
            store.create_schema()
            assert claim(store, Scope("acme", "pgbouncer.schema", "k-1")).created


# -- the rules as plain functions, for the suites that predate StoreContract ------------------
@pytest.fixture(params=STORE_KINDS + ASYNC_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Any]:
    """A store of ``store_kind`` (an async one behind ``StoreContract``'s blocking face)."""
    if store_kind in ASYNC_STORE_KINDS:
        with blocking(new_async_store(store_kind, unique_prefix("ac"))) as face:
            yield face
    else:
        with sync_store(store_kind, tmp_path) as made:
            yield made


def _plain(name: str) -> Callable[[Any], None]:
    method = getattr(StoreContract, name)

    def rule(store: Any) -> None:
        method(StoreContract(), store)

    rule.__name__ = rule.__qualname__ = name
    rule.__doc__ = method.__doc__
    rule.contract_rule_of = __name__  # type: ignore[attr-defined]
    return rule


#: ``{"test_…": rule(store)}``: collected where a suite imports them, never here
#: (``tests/conftest.py`` ``pytest_pycollect_makeitem``): here the classes above run them.
RULES = {name: _plain(name) for name in dir(StoreContract) if name.startswith("test_")}
globals().update(RULES)
#: What those suites import from here.
__all__ = ["NOW", "RULES", "claim", "store", "store_kind"]
