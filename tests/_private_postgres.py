"""A PostgreSQL cluster of the test session's own, for the tests that stop and restart one.

The machine's PostgreSQL (5432) is shared by every test run on the machine; a test that
restarted it would break whatever else was using it at that moment.  The fault tests
(``tests/chaos``, ``tests/test_store_faults.py``, the restart test of
``tests/stores/test_sql_store.py``) therefore run against a private cluster: ``initdb`` into a
temporary directory (as the ``postgres`` user when the tests run as root: ``initdb`` and
``pg_ctl`` refuse to run as root), trust authentication, listening on 127.0.0.1 on a free port
with a socket directory of its own, a database ``test``; started once per session by the
:func:`private_postgres` fixture, stopped and removed at the end of the session.
:func:`scram_postgres` is a second one whose TCP connections authenticate with scram-sha-256
(a superuser password, ``password_encryption = 'scram-sha-256'``, ``pg_hba.conf``'s
``host all all 127.0.0.1/32 scram-sha-256``), for the wrong-password tests.

Its faults are *verified* before anyone counts them (:meth:`PrivatePostgres.restart`): a
restart is one only when ``pg_ctl`` succeeded both ways, a connection was refused while the
server was down, and the new postmaster has a new pid.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ._services import IN_CI

#: Where ``initdb``/``pg_ctl`` live, when not the newest ``/usr/lib/postgresql/*/bin``.
BIN_ENV = "IDEMPOTENT_TASKS_PG_BIN"
DATABASE = "test"
START_TIMEOUT = 60


class FaultNotVerified(AssertionError):
    """A fault the test asked for did not demonstrably happen: it must not be counted."""


@dataclass(frozen=True)
class Restart:
    """Evidence of one restart: the postmaster pids before and after, and the refused
    connection attempt made while the server was down."""

    old_pid: int
    new_pid: int
    refused: str
    seconds: float


def bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (newest installed major version)."""
    if os.environ.get(BIN_ENV):
        return Path(os.environ[BIN_ENV])
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                        else 0)
    if candidates:
        return candidates[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def refused(port: int) -> str | None:
    """The error of a TCP connection attempt to ``port`` when it is refused, else ``None``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return None
    except ConnectionRefusedError as exc:
        return repr(exc)
    except OSError:
        return None  # a timeout is not a refusal


class PrivatePostgres:
    """One private cluster (see the module docstring); :meth:`create` builds and starts it."""

    def __init__(self, root: Path, bin_dir: Path, port: int, password: str | None = None) -> None:
        self.root, self.bin, self.port, self.password = root, bin_dir, port, password
        self.data = root / "data"
        self.sockets = root / "sockets"
        self.logfile = root / "postgres.log"

    # -- addresses ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the ``test`` database."""
        return f"postgresql+psycopg://{self._user}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def dsn(self) -> str:
        """The libpq DSN of the ``test`` database."""
        return f"postgresql://{self._user}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def _user(self) -> str:
        return "postgres" if self.password is None else f"postgres:{self.password}"

    # -- life cycle --------------------------------------------------------------------------
    @classmethod
    def create(cls, bin_dir: Path, password: str | None = None) -> PrivatePostgres:
        """A started cluster; with ``password``, TCP connections authenticate with
        scram-sha-256 as ``postgres``/``password`` (the socket directory stays trusted)."""
        root = Path(tempfile.mkdtemp(prefix="idempotent-tasks-pg-"))
        pg = cls(root, bin_dir, _free_port(), password)
        try:
            pg.sockets.mkdir()
            if os.geteuid() == 0:
                owner = pwd.getpwnam("postgres")
                for path in (root, pg.sockets):
                    os.chown(path, owner.pw_uid, owner.pw_gid)
            pg._run("initdb", "-D", str(pg.data), "-U", "postgres", *pg._auth_args(), "-E",
                    "UTF8", "--no-instructions", timeout=120)
            with (pg.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
                conf.write(
                    f"\nport = {pg.port}\nlisten_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{pg.sockets}'\nmax_connections = 300\n"
                    "password_encryption = 'scram-sha-256'\n"
                )
            pg.start()
            pg._run("createdb", "-h", str(pg.sockets), "-p", str(pg.port), "-U", "postgres",
                    DATABASE)
        except BaseException:
            pg.destroy()
            raise
        return pg

    def _auth_args(self) -> list[str]:
        """initdb's authentication: trust, or scram-sha-256 over TCP (``pg_hba.conf``:
        ``host all all 127.0.0.1/32 scram-sha-256``) with the superuser's password."""
        if self.password is None:
            return ["-A", "trust"]
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n", encoding="utf-8")
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        return ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w",
                  "-t", str(START_TIMEOUT), "start", timeout=START_TIMEOUT + 10)
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every connection is terminated) and check it is gone."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(START_TIMEOUT),
                  "stop", timeout=START_TIMEOUT + 10)

    def restart(self) -> Restart:
        """A verified restart: ``FaultNotVerified`` unless the server went down (a connection
        was refused), came back, and runs under a new postmaster pid."""
        started = time.monotonic()
        old = self.postmaster_pid()
        if old is None:
            raise FaultNotVerified("PostgreSQL was not running before the restart")
        try:
            self.stop()
            down = refused(self.port)
        finally:
            self.ensure_running()
        new = self.postmaster_pid()
        if down is None:
            raise FaultNotVerified("no connection was refused while PostgreSQL was stopped")
        if new is None or new == old:
            raise FaultNotVerified(f"postmaster pid {old} -> {new}: no new server")
        return Restart(old, new, down, round(time.monotonic() - started, 2))

    def ensure_running(self) -> None:
        """Leave the server running, whatever happened before."""
        if self.postmaster_pid() is None:
            self.start()
        self.wait_ready()

    def destroy(self) -> None:
        if self.postmaster_pid() is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- state -------------------------------------------------------------------------------
    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (from ``postmaster.pid``, checked in ``/proc``)."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def ready(self) -> bool:
        done = subprocess.run(
            [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            check=False, capture_output=True, timeout=10,
        )
        return done.returncode == 0

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"private PostgreSQL on {self.port} did not come up; "
                                     f"log:\n{self.log_tail()}")
            time.sleep(0.1)  # polling a server coming up, not a race

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.logfile.read_text(errors="replace")[-chars:]
        return ""

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, check=False, capture_output=True, timeout=timeout,
                              cwd=self.root)
        if done.returncode != 0:
            raise FaultNotVerified(
                f"{tool} {' '.join(args)} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()}\n{self.log_tail()}"
            )


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    """The session's private cluster (skipped locally, a failure under ``CI=true``, when the
    PostgreSQL server binaries are not installed)."""
    pg = PrivatePostgres.create(_required_bindir())
    try:
        yield pg
    finally:
        pg.destroy()


#: The password of :func:`scram_postgres`'s superuser.
SCRAM_PASSWORD = "right-password"


@pytest.fixture(scope="session")
def scram_postgres() -> Iterator[PrivatePostgres]:
    """A private cluster whose TCP connections authenticate with scram-sha-256 (its ``url`` and
    ``dsn`` carry :data:`SCRAM_PASSWORD`), for the wrong-password tests."""
    pg = PrivatePostgres.create(_required_bindir(), password=SCRAM_PASSWORD)
    try:
        yield pg
    finally:
        pg.destroy()


def _required_bindir() -> Path:
    """Where initdb is (skipped locally, a failure under ``CI=true``, when it is not)."""
    bin_dir = bindir()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        message = "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
        if IN_CI:
            pytest.fail(message + " (CI=true: service-backed tests never skip)")
        pytest.skip(message)
    return bin_dir
