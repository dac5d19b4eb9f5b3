"""The servers behind the ``mysql`` and ``dynamodb`` store kinds of the shared fixtures.

* MariaDB: the machine's server (root, empty password), in a database of this test session's
  own (``idem_<hex>``), created on first use and dropped when the session ends; each store
  gets its own table prefix in it.
* DynamoDB: ``moto_server`` (moto's DynamoDB over HTTP, a separate process on a free port),
  started on first use and stopped when the session ends; each store gets its own table.
  Never moto's in-process mocks: the store is tested through the network like the service.

Both are started lazily from plain functions (``tests/conftest.py``'s ``make_store`` is one,
and the Hypothesis model calls it without fixtures); ``atexit`` tears them down.  Under
``CI=true`` a missing server fails, never skips.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests._services import IN_CI, reachable
from tests._wait import budget

MARIADB_HOST = os.environ.get("IDEMPOTENT_TASKS_TEST_MARIADB_HOST", "127.0.0.1")
MARIADB_PORT = int(os.environ.get("IDEMPOTENT_TASKS_TEST_MARIADB_PORT", "3306"))
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _missing(message: str) -> None:
    if IN_CI:
        pytest.fail(message + " (CI=true: service-backed tests never skip)")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- MariaDB ----------------------------------------------------------------------------------
def mariadb_admin() -> Any:
    """An autocommit PyMySQL connection to the server (no database selected)."""
    import pymysql

    return pymysql.connect(host=MARIADB_HOST, port=MARIADB_PORT, user="root", autocommit=True,
                           connect_timeout=5)


def mysql_url() -> str:
    """``mysql+pymysql://…/idem_<hex>``: this session's own database (created once)."""
    with _LOCK:
        if "mysql_url" not in _STATE:
            if not reachable(MARIADB_PORT, MARIADB_HOST):
                _missing(f"MariaDB is not reachable on {MARIADB_HOST}:{MARIADB_PORT}")
            name = f"idem_{uuid.uuid4().hex[:12]}"
            conn = mariadb_admin()
            try:
                conn.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
            finally:
                conn.close()
            atexit.register(_drop_database, name)
            _STATE["mysql_db"] = name
            _STATE["mysql_url"] = (
                f"mysql+pymysql://root@{MARIADB_HOST}:{MARIADB_PORT}/{name}"
            )
        return str(_STATE["mysql_url"])


def _drop_database(name: str) -> None:
    with contextlib.suppress(Exception):
        conn = mariadb_admin()
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        finally:
            conn.close()


# -- moto_server --------------------------------------------------------------------------------
class MotoServer:
    """moto's DynamoDB server as a child process on a free port, over HTTP, one request at a
    time (``_moto_serial.py`` says why ``moto_server`` itself is not used)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="idem-moto-"))
        self._log = (self._dir / "moto.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_moto_serial.py")), "127.0.0.1",
             str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **aws_env()},
        )
        deadline = time.monotonic() + budget(30)
        while not reachable(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not start on port {self.port}")
            time.sleep(0.05)  # polling a child's socket to come up, not a race window

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(budget(10))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(budget(10))
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def aws_env() -> dict[str, str]:
    """boto3 needs some credentials and a region; moto accepts any."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}


def moto_endpoint() -> str:
    """The session's moto_server endpoint (started on first use)."""
    with _LOCK:
        if "moto" not in _STATE:
            if shutil.which("moto_server") is None and not Path(sys.executable).with_name(
                "moto_server"
            ).exists():
                _missing("moto_server is not installed (pip install 'moto[server,dynamodb]')")
            for name, value in aws_env().items():
                os.environ.setdefault(name, value)
            server = MotoServer()
            atexit.register(server.stop)
            _STATE["moto"] = server
        return str(_STATE["moto"].endpoint)


def unique(base: str) -> str:
    return f"{base}_{uuid.uuid4().hex[:10]}"


def make_mysql_store(prefix: str | None = None) -> Any:
    from idempotent_tasks import SQLStore

    store = SQLStore(mysql_url(), table_prefix=prefix or unique("it"))
    store.create_schema()
    return store


def make_dynamodb_store(table: str | None = None, **options: Any) -> Any:
    """A store on a table of its own.  One index shard by default: moto answers a request in
    ~4 ms, and the shared suites call recovery and cleanup often (each reads every shard);
    tests/stores/test_dynamodb_store.py runs several shards."""
    from idempotent_tasks import DynamoDBStore

    options.setdefault("index_shards", 1)
    store = DynamoDBStore(table or unique("it").replace("_", "-"), endpoint_url=moto_endpoint(),
                          region_name="us-east-1", **options)
    store.create_table()
    return store
