"""Where the real services live, and how tests insist on them.

Under ``CI=true`` a missing service is a failure, never a skip: CI starts every service
before the tests run (``.ci/run``), so a missing one means the run proves nothing.
"""

from __future__ import annotations

import os
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"

POSTGRES_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("IDEMPOTENT_TASKS_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//"
)

_PORTS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672}


def reachable(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require(service: str) -> None:
    """Skip (locally) or fail (in CI) when ``service`` is not listening."""
    if reachable(_PORTS[service]):
        return
    message = f"{service} is not reachable on 127.0.0.1:{_PORTS[service]}"
    if IN_CI:
        pytest.fail(message + " (CI=true: service-backed tests never skip)")
    pytest.skip(message)
