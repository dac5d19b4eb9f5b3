"""Run inside a fresh virtualenv: import every public module and touch every optional piece,
printing ``{check: "ok" | the error}`` as JSON.  No server is needed: the store checks point
at a closed port, where an installed driver answers STORE_UNAVAILABLE and a missing one the
install hint."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable

MODULES = (
    "idempotent_tasks", "idempotent_tasks.typing", "idempotent_tasks.testing",
    "idempotent_tasks.enqueue", "idempotent_tasks.cli", "idempotent_tasks.demo",
    "idempotent_tasks.stores", "idempotent_tasks.stores.memory", "idempotent_tasks.stores.sql",
    "idempotent_tasks.stores.redis", "idempotent_tasks.stores.urls", "idempotent_tasks.caches",
    "idempotent_tasks.caches.memory", "idempotent_tasks.caches.redis",
    "idempotent_tasks.metrics_server", "idempotent_tasks.http", "idempotent_tasks.consumers",
    "idempotent_tasks.celery", "idempotent_tasks.dramatiq", "idempotent_tasks.consumers.kafka",
    "idempotent_tasks.consumers.rabbitmq", "idempotent_tasks.dashboard",
)
CLOSED = "127.0.0.1:1"


def _store(url: str) -> None:
    from idempotent_tasks import StoreUnavailableError
    from idempotent_tasks.stores.urls import store_from_url

    try:
        store_from_url(url, connect_timeout=2).stats()
    except StoreUnavailableError:
        return  # the driver is there; the (closed) port is not
    raise AssertionError("a closed port answered")


def _prometheus() -> None:
    from idempotent_tasks import PrometheusMetrics

    PrometheusMetrics()


CHECKS: dict[str, Callable[[], None]] = {
    "use:postgres": lambda: _store(f"postgresql+psycopg://u@{CLOSED}/x"),
    "use:redis": lambda: _store(f"redis://{CLOSED}/0"),
    "use:prometheus": _prometheus,
}


def main() -> None:
    out: dict[str, str] = {}
    for name in MODULES:
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    for name, check in CHECKS.items():
        try:
            check()
            out[name] = "ok"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
