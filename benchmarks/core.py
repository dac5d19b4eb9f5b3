"""``execute()`` against each store, beside the raw floor measured in the same run."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryCache,
    MemoryStore,
    PrometheusMetrics,
)
from idempotent_tasks.stores.base import Store

from ._timing import per_op_us
from .floors import pg_floor, redis_floor, sqlite_floor

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def open_store(kind: str, workdir: Path) -> Iterator[Store]:
    store: Any
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        from idempotent_tasks import SQLStore

        store = SQLStore(f"sqlite:///{workdir / 'bench.db'}")
    elif kind == "postgresql":
        from idempotent_tasks import SQLStore

        store = SQLStore(POSTGRES_URL, table_prefix=f"bench_{uuid.uuid4().hex[:8]}")
    elif kind == "redis":
        from idempotent_tasks import RedisStore

        store = RedisStore(REDIS_URL, prefix=f"bench:{uuid.uuid4().hex[:8]}")
    else:
        raise ValueError(kind)
    store.create_schema()
    try:
        yield store
    finally:
        drop = getattr(store, "drop_schema", None)
        if drop is not None:
            drop()
        store.close()


def _handler(store: Store, cache: Any = None) -> IdempotencyHandler:
    from prometheus_client import CollectorRegistry

    return IdempotencyHandler(store, cache, metrics=PrometheusMetrics(CollectorRegistry()))


def measure_store(kind: str, n: int) -> dict[str, float]:
    """µs per op for: first delivery, replay (store), replay (local cache), in-progress."""
    with tempfile.TemporaryDirectory() as tmp, open_store(kind, Path(tmp)) as store:
        h = _handler(store)
        body = lambda: {"ok": True}  # noqa: E731 - the cheapest body
        payload = {"amount": 100}

        def first(i: int) -> None:
            h.execute(body, operation="bench", tenant="t", key=f"first-{i}", payload=payload)

        def replay(_: int) -> None:
            h.execute(body, operation="bench", tenant="t", key="first-0", payload=payload)

        cached = _handler(store, MemoryCache())
        cached.execute(body, operation="bench", tenant="t", key="first-0", payload=payload)

        def replay_cached(_: int) -> None:
            cached.execute(body, operation="bench", tenant="t", key="first-0", payload=payload)

        call = h.prepare("bench", "t", "busy", payload, True)
        assert call is not None
        h.claim(call)

        def in_progress(_: int) -> None:
            try:
                h.execute(body, operation="bench", tenant="t", key="busy", payload=payload)
            except IdempotencyError as exc:
                assert exc.code == ErrorCode.REQUEST_IN_PROGRESS

        return {
            "first delivery": per_op_us(first, n),
            "replay (store)": per_op_us(replay, n),
            "replay (local cache)": per_op_us(replay_cached, n),
            "in-progress rejection": per_op_us(in_progress, n),
        }


def measure_floor(kind: str, n: int) -> dict[str, float]:
    if kind == "postgresql":
        return pg_floor(POSTGRES_DSN, n)
    if kind == "redis":
        return redis_floor(REDIS_URL, n)
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return sqlite_floor(Path(tmp) / "floor.db", n)
    return {}
