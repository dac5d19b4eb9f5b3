"""A store's first connection, when it cannot be made, fails for what it is — on every store,
sync and async, against real servers.

* A server that accepts TCP and never answers (a *silent listener*: the kernel completes the
  TCP handshake from the backlog, nothing ever reads or writes) is ``STORE_UNAVAILABLE``
  within the connect timeout, the driver's handshake included.  Every store here gets a
  socket timeout far above the bound, so a handshake read under the socket timeout (PyMySQL's
  read timeout, redis-py's socket timeout) fails the test.
* Credentials the server refuses are ``CONFIGURATION_ERROR`` carrying the server's own
  reason, within the connect timeout: a private PostgreSQL with scram-sha-256, a MariaDB user
  of this test's own, a private ``redis-server --requirepass``.  The right password works on
  the same server (so the password is the only thing wrong).
* A handler never runs a body on such a store, and says ``rejected`` (dead-lettered, not
  retried for ever).
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from idempotent_tasks import (
    AsyncRedisStore,
    AsyncSQLStore,
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    RedisStore,
    SQLStore,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import EXIT_STORE_UNAVAILABLE, cli

from .._private_postgres import SCRAM_PASSWORD, PrivatePostgres
from .._services import require
from .._wait import budget
from ._backends import MARIADB_HOST, MARIADB_PORT, free_port, mariadb_admin, mysql_url
from .test_redis_store import start_redis, stop_redis

S = Scope("acme", "payments.charge", "k-1")
CONNECT_TIMEOUT = 1.0
#: How long a first call on a silent server may take: the connect timeout, and the test
#: budget for everything else (a loaded machine).
BOUND = CONNECT_TIMEOUT + budget(5)
#: Far above BOUND: a handshake waiting for the socket timeout fails the test.
SOCKET_TIMEOUT = 3 * BOUND
#: The connect timeout of the wrong-password tests: a refusal must come well within it.
AUTH_TIMEOUT = budget(10)
WRONG = "wrong-password"

#: Store kind -> (URL scheme, constructor, async?).
KINDS: dict[str, tuple[str, Callable[..., Any], bool]] = {
    "mysql": ("mysql+pymysql", SQLStore, False),
    "postgres": ("postgresql+psycopg", SQLStore, False),
    "psycopg-async": ("postgresql+psycopg", AsyncSQLStore, True),
    "asyncpg": ("postgresql+asyncpg", AsyncSQLStore, True),
    "redis": ("redis", RedisStore, False),
    "redis-async": ("redis", AsyncRedisStore, True),
}


def make_store(kind: str, netloc: str, path: str, connect_timeout: float) -> Any:
    scheme, constructor, _ = KINDS[kind]
    prefix = {"prefix": "ct" + uuid.uuid4().hex[:8]} if "redis" in kind else {
        "table_prefix": "ct" + uuid.uuid4().hex[:8]
    }
    return constructor(f"{scheme}://{netloc}/{path}", connect_timeout=connect_timeout,
                       socket_timeout=SOCKET_TIMEOUT, **prefix)


def first_call(kind: str, store: Any) -> tuple[float, IdempotencyError]:
    """The seconds the store's first call took to fail, and its error."""
    started = time.monotonic()
    try:
        if KINDS[kind][2]:
            asyncio.run(_get_then_close(store))
        else:
            try:
                store.get(S)
            finally:
                store.close()
    except IdempotencyError as exc:
        return time.monotonic() - started, exc
    raise AssertionError(f"{kind}: the first call succeeded")


async def _get_then_close(store: Any) -> None:
    try:
        await store.get(S)
    finally:
        await store.close()


def round_trip(kind: str, store: Any) -> None:
    """The schema created, a record read (none), the schema dropped: the store works."""
    if KINDS[kind][2]:
        async def go() -> None:
            try:
                await store.create_schema()
                assert await store.get(S) is None
                await store.drop_schema()
            finally:
                await store.close()

        asyncio.run(go())
        return
    try:
        store.create_schema()
        assert store.get(S) is None
        store.drop_schema()
    finally:
        store.close()


# -- a server that never answers ----------------------------------------------------------
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener that accepts connections (backlog) and never reads or writes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_server_that_never_answers_fails_within_the_connect_timeout(
    kind: str, silent_port: int
) -> None:
    user = "postgres" if "postgres" in kind or kind == "asyncpg" else "root"
    netloc = f"127.0.0.1:{silent_port}" if "redis" in kind else f"{user}@127.0.0.1:{silent_port}"
    store = make_store(kind, netloc, "0" if "redis" in kind else "test", CONNECT_TIMEOUT)
    elapsed, error = first_call(kind, store)
    assert error.code is ErrorCode.STORE_UNAVAILABLE, error
    assert elapsed < BOUND, f"{kind}: {elapsed:.1f}s on a silent server ({error})"


def test_the_cli_connect_timeout_bounds_a_silent_server(silent_port: int) -> None:
    url = f"mysql+pymysql://root@127.0.0.1:{silent_port}/test"  # its socket timeout: 30 s
    started = time.monotonic()
    result = CliRunner().invoke(
        cli, ["--store", url, "--connect-timeout", str(CONNECT_TIMEOUT), "stats"]
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_STORE_UNAVAILABLE, result.output
    assert elapsed < BOUND, f"{elapsed:.1f}s"


# -- credentials the server refuses ---------------------------------------------------------
@pytest.fixture(scope="module")
def mariadb_user() -> Iterator[tuple[str, str, str]]:
    """A MariaDB user of this module's own with a password, allowed on the session's
    database; dropped afterwards.  (user, password, database)"""
    database = mysql_url().rsplit("/", 1)[1]
    user, password = f"idem_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    admin = mariadb_admin()
    try:
        cursor = admin.cursor()
        cursor.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'")
        cursor.execute(f"GRANT ALL ON {database}.* TO '{user}'@'%'")
        yield user, password, database
    finally:
        admin.cursor().execute(f"DROP USER IF EXISTS '{user}'@'%'")
        admin.close()


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A private ``redis-server --requirepass`` on a free port.  (port, password)"""
    require("redis")
    port, password = free_port(), uuid.uuid4().hex
    proc = start_redis(port, tmp_path_factory.mktemp("redis-auth"), password=password)
    try:
        yield port, password
    finally:
        stop_redis(proc)


@pytest.fixture
def server(
    kind: str, request: pytest.FixtureRequest
) -> tuple[Callable[[str], str], str, str, str]:
    """Where ``kind``'s password-protected server is: (netloc for a password, the database
    path, the right password, the refusal's words the error must carry)."""
    if "redis" in kind:
        port, password = request.getfixturevalue("redis_with_password")
        return (lambda pw: f":{pw}@127.0.0.1:{port}"), "0", password, (
            "invalid username-password pair"
        )
    if kind == "mysql":
        user, password, database = request.getfixturevalue("mariadb_user")
        return (lambda pw: f"{user}:{pw}@{MARIADB_HOST}:{MARIADB_PORT}"), database, password, (
            f"Access denied for user '{user}'"
        )
    pg: PrivatePostgres = request.getfixturevalue("scram_postgres")
    return (lambda pw: f"postgres:{pw}@127.0.0.1:{pg.port}"), "test", SCRAM_PASSWORD, (
        'password authentication failed for user "postgres"'
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_wrong_password_is_a_configuration_error_with_the_servers_reason(
    kind: str, server: tuple[Callable[[str], str], str, str, str]
) -> None:
    netloc, path, password, reason = server
    round_trip(kind, make_store(kind, netloc(password), path, AUTH_TIMEOUT))
    elapsed, error = first_call(kind, make_store(kind, netloc(WRONG), path, AUTH_TIMEOUT))
    assert error.code is ErrorCode.CONFIGURATION_ERROR, error
    assert reason in str(error)
    assert elapsed < AUTH_TIMEOUT, f"{kind}: {elapsed:.1f}s"


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_a_handler_rejects_a_wrong_password_without_running_the_body(
    kind: str, server: tuple[Callable[[str], str], str, str, str]
) -> None:
    """Not retried for ever: ``rejected`` is a dead-letter kind in every integration."""
    netloc, path, _, reason = server
    store = make_store(kind, netloc(WRONG), path, AUTH_TIMEOUT)
    handler = IdempotencyHandler(store, metrics=None)
    ran: list[str] = []
    try:
        outcome = handler.run(lambda: ran.append("body"), operation="payments.charge",
                              tenant="acme", key="k-1")
    finally:
        handler.close()
        store.close()
    assert (outcome.kind, outcome.error_code) == ("rejected", ErrorCode.CONFIGURATION_ERROR)
    assert outcome.dead_letter
    assert reason in (outcome.detail or "")
    assert ran == []

