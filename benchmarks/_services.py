"""Service addresses, clean-up of what a run leaves behind, and one retry on connection loss.

Other sessions share these servers and some restart PostgreSQL briefly: a section that fails
with a connection error waits for the service to come back and runs once more (the runner
reports the retry).  Tables and keys that could not be dropped at once (the server was away)
are dropped at the end of the run.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
PORTS = {"postgresql": 5432, "redis": 6379, "rabbitmq": 5672}

#: (kind, prefix) of stores whose drop failed; retried by ``drop_leftovers``.
LEFTOVERS: list[tuple[str, str]] = []
#: (kind, prefix) of every PostgreSQL / Redis store opened in this run: dropped again at the
#: end (idempotent), in case a drop was cut short by a server restart.
OPENED: list[tuple[str, str]] = []
#: Notes for the report: retries and failures.
NOISE: list[str] = []


def listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for_services(timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(listening(p) for p in PORTS.values()):
            time.sleep(1.0)  # PostgreSQL accepts TCP before it accepts logins
            return
        time.sleep(0.5)


def is_connection_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    words = ("connection", "shutting down", "store_unavailable", "terminating", "admin",
             "refused", "closed", "reset by peer", "timeout", "starting up")
    return any(w in text for w in words)


def retry_on_connection_loss(label: str, fn: Callable[[], T], attempts: int = 2) -> T:
    """``fn()``; after a connection error, wait for the services and run it again, up to
    ``attempts`` runs in all (each retry is noted for the report)."""
    for attempt in range(1, attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            NOISE.append(f"{label}: retried ({attempt}) after {type(exc).__name__}: "
                         f"{str(exc)[:120]}")
            wait_for_services()
    return fn()


def retry_once(label: str, fn: Callable[[], T]) -> T:
    """``fn()``; on a connection error, wait for the services and run it once more."""
    return retry_on_connection_loss(label, fn)


def drop_store(store: Any, kind: str, prefix: str) -> None:
    if kind in ("postgresql", "redis"):
        OPENED.append((kind, prefix))
    try:
        drop = getattr(store, "drop_schema", None)
        if drop is not None:
            drop()
    except Exception:
        LEFTOVERS.append((kind, prefix))
    with contextlib.suppress(Exception):
        store.close()


def drop_leftovers() -> None:
    """Drop every store this run opened (again: ``drop_schema`` is idempotent)."""
    for item in OPENED:
        if item not in LEFTOVERS:
            LEFTOVERS.append(item)
    OPENED.clear()
    if not LEFTOVERS:
        return
    wait_for_services()
    from idempotent_tasks import RedisStore, SQLStore

    for kind, prefix in list(LEFTOVERS):
        store: Any = (
            SQLStore(POSTGRES_URL, table_prefix=prefix)
            if kind == "postgresql"
            else RedisStore(REDIS_URL, prefix=prefix)
        )
        with contextlib.suppress(Exception):
            store.drop_schema()
            LEFTOVERS.remove((kind, prefix))
        with contextlib.suppress(Exception):
            store.close()
