"""The things a chaos run breaks, and how each is always put back.

* PostgreSQL: the session's private cluster (``tests/_private_postgres.py``), restarted with
  ``pg_ctl`` — the machine's PostgreSQL is never touched.
* Redis (the cache): a private ``redis-server`` on a free port, killed and started again —
  the shared one on 6379 is never touched.
* RabbitMQ: every run gets its own vhost; "closing broker connections" closes that vhost's
  connections only (other tests on the same broker are unaffected); the vhost, and with it
  every queue of the run, is deleted at the end.
* Redis (a Celery broker): a private ``redis-server`` too; "dropping broker connections" is
  ``CLIENT KILL TYPE normal`` on it.
* Worker processes: each in its own process group (SIGKILL / SIGSTOP reach its children
  too), restarted at once when they die.

Every fault is *verified* before the harness counts it (:class:`FaultNotVerified` otherwise,
which fails the run): a killed worker's whole process group is gone, a stopped one is in the
``T`` state, a dropped connection is no longer listed by the broker, a stopped Redis refused a
connection, and a PostgreSQL restart shows a refused connection and a new postmaster pid.
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

import redis

from tests._private_postgres import FaultNotVerified, refused
from tests._wait import wait_until as _wait_until


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    """Wait for a state another process produces; fail loudly at the (scaled) deadline."""
    _wait_until(predicate, what, timeout, poll=poll)


def wall_clock() -> str:
    """The time as the worker logs print it (to line a delivery up with their lines)."""
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


# -- Redis (the cache, or a Celery broker) ------------------------------------------------------
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
        """The server is gone for ``seconds`` (a fault's duration), then back, empty.
        Verified: it died of the SIGKILL and a connection was refused meanwhile."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            raise FaultNotVerified(f"redis-server on {self.port} was not running")
        self.stop()
        down = refused(self.port)
        if proc.returncode != -signal.SIGKILL or down is None:
            raise FaultNotVerified(f"redis-server on {self.port}: exit {proc.returncode}, "
                                   f"refused={down}")
        time.sleep(seconds)  # the fault's duration
        self.start()

    def drop_clients(self) -> int:
        """``CLIENT KILL TYPE normal`` every client but ours; verified: none of the clients
        listed before is listed after.  Returns how many were dropped."""
        with redis.Redis.from_url(self.url, socket_timeout=5) as admin:
            before = _client_ids(admin)
            admin.client_kill_filter(_type="normal", skipme=True)
            if not before:
                raise FaultNotVerified("no broker connection to drop")
            wait_until(lambda: not before & _client_ids(admin), 10,
                       "the dropped Redis clients to disappear")
        return len(before)


def _client_ids(admin: redis.Redis) -> set[int]:
    me = admin.client_id()
    return {int(c["id"]) for c in admin.client_list(_type="normal") if int(c["id"]) != me}


# -- RabbitMQ ----------------------------------------------------------------------------------
def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True,
                          timeout=60)
    return done.stdout.decode(errors="replace")


class RabbitVhost:
    """A vhost of our own: its connections can be closed without touching anyone else's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def url(self, scheme: str = "amqp") -> str:
        return f"{scheme}://guest:guest@127.0.0.1:5672/{self.name}"

    def create(self) -> None:
        rabbitmqctl("add_vhost", self.name)
        rabbitmqctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")

    def connections(self) -> set[str]:
        """The names (``peer -> local``) of the vhost's connections that are not closing: a
        connection the server closed stays listed as ``closing`` until its client answers
        (an idle client may not read its socket for a while), but it carries nothing."""
        out = rabbitmqctl("list_connections", "--no-table-headers", "name", "vhost", "state")
        names = set()
        for line in out.splitlines():
            name, vhost, state = [*line.rsplit("\t", 2), "", ""][:3]
            if vhost.strip() == self.name and state.strip() not in ("closing", "closed"):
                names.add(name.strip())
        return names

    def close_connections(self) -> int:
        """Close every connection of the vhost; verified: none of those open before is open
        after (one still opening when ``close_all_connections`` ran is closed by name).
        Returns how many were closed."""
        deadline = time.monotonic() + 20
        while not (before := self.connections()):  # the last fault's reconnects may lag
            if time.monotonic() > deadline:
                raise FaultNotVerified(f"vhost {self.name} had no connection to close")
            time.sleep(0.5)  # polling the broker's view
        rabbitmqctl("close_all_connections", "--vhost", self.name, "--limit", "10000", "chaos")
        deadline = time.monotonic() + 20
        while left := before & self.connections():
            if time.monotonic() > deadline:
                raise FaultNotVerified(f"RabbitMQ connections still open: {sorted(left)}")
            time.sleep(0.5)  # polling the broker's view
            for name in left:
                with contextlib.suppress(subprocess.SubprocessError):
                    rabbitmqctl("close_connection", name, "chaos")
        return len(before)

    def delete(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            rabbitmqctl("delete_vhost", self.name)


# -- worker processes --------------------------------------------------------------------------
def group_states(pgid: int) -> dict[int, str]:
    """pid -> state letter of every live (not zombie) process in the process group."""
    states = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                states[int(stat.parent.name)] = fields[0]
    return states


class Workers:
    """``count`` worker subprocesses, each its own process group; dead ones are restarted at
    once (by :meth:`kill_random` itself, or by the monitor thread for deaths the harness did
    not cause, e.g. a crash key's self-kill)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, logdir: Path,
                 count: int, rng: random.Random) -> None:
        self.command, self.env, self.cwd, self.logdir = command, env, cwd, logdir
        self.rng = rng
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
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

    def _pick_alive(self) -> int:
        alive = [i for i, p in enumerate(self.procs) if p.poll() is None]
        if not alive:
            raise FaultNotVerified("no live worker to break")
        return self.rng.choice(alive)

    def kill_random(self) -> int:
        """SIGKILL a random live worker's whole process group and start a new one at once.
        Verified: the leader died of SIGKILL and no process of the group is left."""
        with self._lock:
            i = self._pick_alive()
            proc = self.procs[i]
            _signal_group(proc, signal.SIGKILL)
            proc.wait(10)
            self.procs[i] = self._spawn()
        if proc.returncode != -signal.SIGKILL:
            raise FaultNotVerified(f"worker {proc.pid} exited {proc.returncode}, not by SIGKILL")
        wait_until(lambda: not group_states(proc.pid), 10, f"worker group {proc.pid} to die")
        return proc.pid

    def stop_random(self, seconds: float) -> int:
        """SIGSTOP a random worker for ``seconds`` (longer than a lease or a session), then
        SIGCONT it; returns its pid.  Verified: every process of its group was stopped (state
        ``T``) at the start and at the end of the freeze.  A worker that dies first (a crash
        key killing itself) is replaced by another one."""
        for _ in range(3):
            with self._lock:
                proc = self.procs[self._pick_alive()]
                _signal_group(proc, signal.SIGSTOP)
            if _frozen(proc):
                break
        else:
            raise FaultNotVerified("every worker chosen to stop died first")
        try:
            time.sleep(seconds)  # the fault's duration
            if not _all_stopped(proc.pid):
                raise FaultNotVerified(f"worker group {proc.pid} did not stay stopped: "
                                       f"{group_states(proc.pid)}")
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


def _frozen(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the SIGSTOPped group is stopped (False: it died first; raises when it lives on
    unstopped)."""
    deadline = time.monotonic() + 5
    while proc.poll() is None and not _all_stopped(proc.pid):
        if time.monotonic() > deadline:
            _signal_group(proc, signal.SIGCONT)
            raise FaultNotVerified(f"worker group {proc.pid} did not stop: "
                                   f"{group_states(proc.pid)}")
        time.sleep(0.02)  # polling /proc
    return proc.poll() is None


def _all_stopped(pgid: int) -> bool:
    states = group_states(pgid)
    return bool(states) and all(state == "T" for state in states.values())


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
