"""A real uvicorn process (FastAPI, ASGI) and a real gunicorn process (Flask, WSGI) on free
ports, sharing one PostgreSQL store, spoken to in raw HTTP/1.1 over sockets — what clients
really send, with no test client in between: quoted and bare keys are one key on every
server (and across servers), two ``Idempotency-Key`` fields are refused, a 5 MB body is
protected and replayed, the IETF draft's statuses hold, and concurrent duplicates across
the two processes run the endpoint exactly once, and on a route with
``on_in_progress="wait"`` a duplicate waits for the first and gets its response.

The apps are in tests/http/_server_app.py (``profile="ietf"``).  The first request of the
race is held inside its endpoint by a socket barrier (it says ``entered`` and waits for
``go``), so the duplicates provably arrive while it is in flight — no sleeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from idempotent_tasks import SQLStore
from idempotent_tasks.http import PROBLEM_TYPE_BASE

from .._services import POSTGRES_URL, require
from .._wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
IO_TIMEOUT = 20.0
FIVE_MB = 5 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]


@dataclass
class Stack:
    uvicorn: Server
    gunicorn: Server
    run_log: Path
    event_log: Path

    def runs(self, key: str) -> list[str]:
        """The pids that executed an endpoint for ``key``."""
        lines = self.run_log.read_text().splitlines() if self.run_log.exists() else []
        return [pid for pid, _, k in (line.partition(" ") for line in lines) if k == key]

    def waiting(self, key: str) -> int:
        """How many duplicates of ``key`` the servers' handlers logged as waiting."""
        log = self.event_log
        lines = log.read_text().splitlines() if log.exists() else []
        return lines.count(f"duplicate_waiting {key}")


def _start(name: str, argv: list[str], env: dict[str, str], port: int, log: Path) -> Server:
    out = log.open("wb")
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:  # waiting for readiness, not for a race
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return Server(name, port, process)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{name} did not listen within {START_TIMEOUT}s: {log.read_text()}")


def _stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require("postgres")
    tmp = tmp_path_factory.mktemp("servers")
    prefix = f"srv_{uuid.uuid4().hex[:10]}"
    store = SQLStore(POSTGRES_URL, table_prefix=prefix)
    store.create_schema()
    env = {**os.environ, "IT_STORE_URL": POSTGRES_URL, "IT_TABLE_PREFIX": prefix,
           "IT_RUN_LOG": str(tmp / "runs.log"), "IT_PROFILE": "ietf",
           "IT_EVENT_LOG": str(tmp / "events.log"),
           "PYTHONPATH": str(ROOT)}
    bin_dir = Path(sys.executable).parent
    uport, gport = free_port(), free_port()
    servers: list[Server] = []
    try:
        servers.append(_start("uvicorn", [
            str(bin_dir / "uvicorn"), "tests.http._server_app:asgi_app", "--host", "127.0.0.1",
            "--port", str(uport), "--http", "h11", "--no-access-log", "--workers", "1",
        ], env, uport, tmp / "uvicorn.log"))
        servers.append(_start("gunicorn", [
            str(bin_dir / "gunicorn"), "tests.http._server_app:wsgi_app", "--bind",
            f"127.0.0.1:{gport}", "--workers", "1", "--threads", "4", "--timeout", "60",
        ], env, gport, tmp / "gunicorn.log"))
        yield Stack(servers[0], servers[1], tmp / "runs.log", tmp / "events.log")
    finally:
        for server in servers:
            _stop(server)
        store.drop_schema()
        store.close()


# ------------------------------------------------------------------------- raw HTTP/1.1
@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None

    def json(self) -> dict[str, object]:
        value: dict[str, object] = json.loads(self.body)
        return value


def send(port: int, path: str, fields: list[tuple[str, str]], body: bytes) -> Reply:
    """One POST with exactly these header fields (repeats included), over a new socket."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
             "Content-Type: application/json", f"Content-Length: {len(body)}", "X-Tenant: acme"]
    lines += [f"{name}: {value}" for name, value in fields]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as conn:
        conn.sendall(head + body)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return _parse(b"".join(chunks))


def _parse(raw: bytes) -> Reply:
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = [(k.strip(), v.strip()) for k, _, v in (h.partition(":") for h in header_lines)]
    reply = Reply(int(status_line.split(" ")[1]), headers, rest)
    if (reply.header("transfer-encoding") or "").lower() == "chunked":
        reply.body = _dechunk(rest)
    return reply


def _dechunk(data: bytes) -> bytes:
    out, i = [], 0
    while True:
        end = data.index(b"\r\n", i)
        size = int(data[i:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        i = end + 2 + size + 2


def order(port: int, key_field: str | None, item: str = "1", path: str = "/orders",
          **body: object) -> Reply:
    fields = [] if key_field is None else [("Idempotency-Key", key_field)]
    return send(port, f"{path}/{item}", fields, json.dumps({"n": 1, **body}).encode())


def ports(stack: Stack) -> list[int]:
    return [stack.uvicorn.port, stack.gunicorn.port]


# -------------------------------------------------------------------------------- tests
def test_quoted_and_bare_keys_are_one_key_on_both_servers(stack: Stack) -> None:
    for first, second in ((stack.uvicorn, stack.gunicorn), (stack.gunicorn, stack.uvicorn)):
        key = str(uuid.uuid4())
        fresh = order(first.port, f'"{key}"')
        assert fresh.status == 201 and fresh.header("idempotent-replayed") is None
        for server in (first, second):
            for form in (key, f'"{key}"', f'  {key} '):
                replay = order(server.port, form)
                assert replay.status == 201, (server.name, form, replay)
                assert replay.body == fresh.body
                assert replay.header("idempotent-replayed") == "true"
        assert stack.runs(key) == [str(fresh.json()["pid"])]  # one execution, one key


def test_two_key_fields_are_refused_on_both_servers(stack: Stack) -> None:
    for port in ports(stack):
        for a, b in (("a", "a"), ('"a"', '"b"')):
            r = send(port, "/orders/1", [("Idempotency-Key", a), ("Idempotency-Key", b)],
                     b'{"n": 1}')
            assert r.status == 400 and r.json()["code"] == "INVALID_KEY", (port, r)
            assert r.header("content-type") == "application/problem+json"
    assert stack.runs("a") == stack.runs("b") == []


def test_the_drafts_statuses_on_both_servers(stack: Stack) -> None:
    for port in ports(stack):
        missing = order(port, None)
        assert missing.status == 400 and missing.json()["code"] == "MISSING_KEY"
        assert missing.json()["type"] == f"{PROBLEM_TYPE_BASE}#missing_key"
        key = str(uuid.uuid4())
        assert order(port, key).status == 201
        reused = order(port, key, amount=2)
        assert reused.status == 422
        assert reused.json()["code"] == "KEY_REUSED_WITH_DIFFERENT_REQUEST"


def test_a_5_mb_body_is_protected_and_replayed(stack: Stack) -> None:
    body = os.urandom(FIVE_MB)
    digest = hashlib.sha256(body).hexdigest()
    key = str(uuid.uuid4())
    first = send(stack.uvicorn.port, "/upload", [("Idempotency-Key", key)], body)
    assert first.status == 201 and first.json() == {"bytes": FIVE_MB, "sha256": digest}
    for port in ports(stack):
        again = send(port, "/upload", [("Idempotency-Key", f'"{key}"')], body)
        assert again.status == 201 and again.body == first.body
        assert again.header("idempotent-replayed") == "true"
        other = send(port, "/upload", [("Idempotency-Key", key)], body[:-1] + b"!")
        assert other.status == 422  # the body is part of the request's fingerprint
    wsgi_key = str(uuid.uuid4())
    on_gunicorn = send(stack.gunicorn.port, "/upload", [("Idempotency-Key", wsgi_key)], body)
    assert on_gunicorn.status == 201 and on_gunicorn.json()["sha256"] == digest
    assert len(stack.runs(key)) == 1 and len(stack.runs(wsgi_key)) == 1


class Barrier:
    """A loopback listener the held endpoint connects to (see _server_app)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(IO_TIMEOUT)
        self.port: int = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None

    def wait_entered(self) -> None:
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(IO_TIMEOUT)
        assert self.conn.recv(7) == b"entered"

    def release(self) -> None:
        if self.conn is not None:
            self.conn.sendall(b"go")
            self.conn.close()
        self.listener.close()


@pytest.mark.parametrize("holder", ["uvicorn", "gunicorn"])
def test_concurrent_duplicates_across_two_processes_run_once(stack: Stack, holder: str) -> None:
    first_server = getattr(stack, holder)
    key, barrier = str(uuid.uuid4()), Barrier()
    with ThreadPoolExecutor(max_workers=9) as pool:
        try:
            first = pool.submit(order, first_server.port, f'"{key}"', hold=barrier.port)
            barrier.wait_entered()  # the first request is inside its endpoint now
            duplicates = [
                pool.submit(order, port, form, hold=barrier.port)
                for port in ports(stack) for form in (key, f'"{key}"', f"{key} ", f'"{key}"')
            ]
            busy = [d.result(IO_TIMEOUT) for d in duplicates]
        finally:
            barrier.release()
        done = first.result(IO_TIMEOUT)
    assert done.status == 201
    for r in busy:
        assert r.status == 409 and r.json()["code"] == "REQUEST_IN_PROGRESS", r
        assert r.header("retry-after") == "1"
    for port in ports(stack):
        replay = order(port, key, hold=barrier.port)
        assert replay.status == 201 and replay.body == done.body
    assert stack.runs(key) == [str(done.json()["pid"])]  # exactly one execution


CONTENT_HEADERS = ("content-type", "content-length")


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_a_duplicate_on_a_waiting_route_gets_the_first_response(stack: Stack, server: str) -> None:
    """``Route(..., on_in_progress="wait")``: a duplicate sent while the first request is held
    inside its endpoint waits (its handler logs ``duplicate_waiting``) and, once the first
    answers, gets that response's bytes — status, body, content headers — as a replay."""
    port = getattr(stack, server).port
    key, barrier = str(uuid.uuid4()), Barrier()
    with ThreadPoolExecutor(max_workers=2) as pool:
        try:
            first = pool.submit(order, port, key, path="/waited", hold=barrier.port)
            barrier.wait_entered()  # the first request is inside its endpoint now
            duplicate = pool.submit(order, port, key, path="/waited", hold=barrier.port)
            wait_until(lambda: stack.waiting(key) == 1, "the duplicate to wait", IO_TIMEOUT)
            assert not duplicate.done()  # it waits for the first, it did not answer 409
        finally:
            barrier.release()
        done, waited = first.result(IO_TIMEOUT), duplicate.result(IO_TIMEOUT)
    assert done.status == 201 and done.header("idempotent-replayed") is None
    assert waited.status == 201 and waited.body == done.body
    assert waited.header("idempotent-replayed") == "true"
    for name in CONTENT_HEADERS:
        assert waited.header(name) == done.header(name), name
    assert stack.runs(key) == [str(done.json()["pid"])]  # exactly one execution
