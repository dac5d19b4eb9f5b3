"""The async stores in a process with more than 1,024 open file descriptors.

``select.select`` cannot wait on a descriptor numbered 1,024 or more (``FD_SETSIZE``); a store
that waits on its sockets that way fails in any busy server (a web process with many client
connections).  Here 1,100 descriptors are held open first, so every connection the stores
open is numbered above 1,100 (checked), and each store then runs a first delivery, a replay
and its maintenance through the handler on the event loop.  The result is large (close to
the default 1 MiB response limit), so writing it fills the socket's send buffer and the
store must wait for the socket to drain: the wait a ``select.select`` would fail on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler
from tests._services import POSTGRES_URL, REDIS_URL, require

HELD = 1_100
#: A response larger than a loopback socket's initial send buffer, within the 1 MiB limit.
BLOB = "x" * 900_000


@contextlib.contextmanager
def many_open_descriptors(count: int = HELD) -> Iterator[int]:
    """Hold ``count`` descriptors open (raising the soft limit for it); yields the number a
    new socket gets now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} < {wanted}: cannot run this test here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        with socket.socket() as probe:
            yield probe.fileno()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _store(kind: str, prefix: str) -> Any:
    if kind in ("psycopg", "asyncpg"):
        require("postgres")
        from idempotent_tasks import AsyncSQLStore

        url = POSTGRES_URL.replace("+psycopg", f"+{kind}")
        return AsyncSQLStore(url, table_prefix=prefix)
    require("redis")
    from idempotent_tasks import AsyncRedisStore

    return AsyncRedisStore(REDIS_URL, prefix=prefix)


async def _deliveries(store: Any) -> list[Any]:
    await store.create_schema()
    handler = IdempotencyHandler(store, metrics=None)
    runs: list[str] = []

    async def body() -> dict[str, Any]:
        runs.append("ran")
        return {"charged": 100, "receipt": BLOB}

    try:
        scope = {"operation": "fds.charge", "tenant": "acme", "key": uuid.uuid4().hex,
                 "payload": {"amount": 100}}
        first = await handler.execute_async(body, **scope)
        replay = await handler.execute_async(body, **scope)
        recovered = await handler.recover_stuck_records_async()
        return [first, replay, runs, recovered]
    finally:
        handler.close()
        await store.drop_schema()
        await store.close()


@pytest.mark.parametrize("kind", ["psycopg", "asyncpg", "redis"])
def test_async_store_works_above_descriptor_1024(kind: str) -> None:
    store = _store(kind, f"it_fds_{uuid.uuid4().hex[:8]}")
    with many_open_descriptors() as next_fd:
        assert next_fd > 1024  # the fault is in place: new sockets are numbered above it
        first, replay, runs, recovered = asyncio.run(_deliveries(store))
    assert first == replay == {"charged": 100, "receipt": BLOB}
    assert runs == ["ran"]
    assert recovered == 0
