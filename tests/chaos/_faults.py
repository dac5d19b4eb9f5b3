"""The things a chaos run breaks, and how each is always put back.

* PostgreSQL: restarted with ``pg_ctlcluster`` (never left stopped: :func:`ensure_postgres`).
* Redis (the cache): a private ``redis-server`` on a free port, killed and started again —
  the shared one on 6379 is never touched.
* RabbitMQ: every run gets its own vhost; "closing broker connections" closes that vhost's
  connections only (other tests on the same broker are unaffected); the vhost, and with it
  every queue of the run, is deleted at the end.
* Worker processes: each in its own process group (SIGKILL / SIGSTOP reach its children
  too), restarted at once when they die.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from tests._services import POSTGRES_URL


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    """Wait for a state another process produces; fail loudly at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


# -- PostgreSQL --------------------------------------------------------------------------------
def _pg_ctl(action: str) -> subprocess.CompletedProcess[bytes]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=False, capture_output=True, timeout=120,
    )


def postgres_ready() -> bool:
    port = str(sa.make_url(POSTGRES_URL).port or 5432)
    ready = subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", port], check=False)
    return ready.returncode == 0


def restart_postgres() -> None:
    """Restart the cluster (fast shutdown: every connection drops) and wait until it serves."""
    try:
        _pg_ctl("restart")
    finally:
        ensure_postgres()


def ensure_postgres() -> None:
    """Leave PostgreSQL running, whatever happened ("already running" is fine)."""
    if not postgres_ready():
        _pg_ctl("start")
    wait_until(postgres_ready, 60, "PostgreSQL to accept connections", poll=0.2)


# -- Redis (the cache) -------------------------------------------------------------------------
class PrivateRedis:
    """A ``redis-server`` of our own, without persistence, that the run may stop."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        wait_until(lambda: port_open(self.port), 20, f"redis-server on {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def outage(self, seconds: float) -> None:
        """The cache is gone for ``seconds`` (a fault's duration), then back, empty."""
        self.stop()
        time.sleep(seconds)
        self.start()


# -- RabbitMQ ----------------------------------------------------------------------------------
def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


class RabbitVhost:
    """A vhost of our own: its connections can be closed without touching anyone else's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def url(self, scheme: str = "amqp") -> str:
        return f"{scheme}://guest:guest@127.0.0.1:5672/{self.name}"

    def create(self) -> None:
        rabbitmqctl("add_vhost", self.name)
        rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")

    def close_connections(self) -> None:
        rabbitmqctl("close_all_connections", "--vhost", self.name, "--limit", "10000", "chaos")

    def delete(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            rabbitmqctl("delete_vhost", self.name)


# -- worker processes --------------------------------------------------------------------------
class Workers:
    """``count`` worker subprocesses, each its own process group; dead ones are restarted at
    once (by :meth:`kill` itself, or by the monitor thread for deaths the harness did not
    cause, e.g. a crash key's self-kill)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, logdir: Path,
                 count: int, rng: random.Random) -> None:
        self.command, self.env, self.cwd, self.logdir = command, env, cwd, logdir
        self.rng = rng
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.kills = 0
        self.stops = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._count = count
        self._monitor = threading.Thread(target=self._watch, daemon=True)

    @property
    def restarts(self) -> int:
        return self.started - self._count

    def start(self) -> None:
        with self._lock:
            self.procs = [self._spawn() for _ in range(self._count)]
        self._monitor.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = (self.logdir / f"worker-{self.started:03d}.log").open("wb")
        with log:
            return subprocess.Popen(
                self.command, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill_random(self) -> None:
        """SIGKILL a random worker's whole process group and start a new one at once."""
        with self._lock:
            i = self.rng.randrange(len(self.procs))
            _signal_group(self.procs[i], signal.SIGKILL)
            self.procs[i].wait(10)
            self.procs[i] = self._spawn()
            self.kills += 1

    def stop_random(self, seconds: float) -> int:
        """SIGSTOP a random worker for ``seconds`` (longer than a lease or a session), then
        SIGCONT it; returns its pid."""
        with self._lock:
            proc = self.procs[self.rng.randrange(len(self.procs))]
            _signal_group(proc, signal.SIGSTOP)
            self.stops += 1
        try:
            time.sleep(seconds)  # the fault's duration
        finally:
            _signal_group(proc, signal.SIGCONT)
        return proc.pid

    def _watch(self) -> None:
        while not self._closing.wait(0.1):
            with self._lock:
                for i, proc in enumerate(self.procs):
                    if proc.poll() is not None and not self._closing.is_set():
                        self.procs[i] = self._spawn()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            for proc in self.procs:
                _signal_group(proc, signal.SIGCONT)
                _signal_group(proc, signal.SIGKILL)
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        if self._monitor.is_alive():
            self._monitor.join(5)

    def log_tail(self, chars: int = 4000) -> str:
        logs = sorted(self.logdir.glob("worker-*.log"))[-4:]
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
