"""A private PostgreSQL primary and a streaming standby, for the failover tests.

Both clusters are ``initdb``'d / ``pg_basebackup``'d by the test into one temporary directory
(made with ``tempfile.mkdtemp`` and handed to the ``postgres`` user, like
``tests/_private_postgres.py``: ``initdb`` refuses to run as root, and pytest's own
``tmp_path`` lies under a root-only directory the ``postgres`` user cannot enter), on free
loopback ports, with trust authentication.  The standby streams from the primary through a
:class:`tests._proxy.TCPProxy`, so a test cuts replication *deterministically*:
:meth:`ReplicatedPair.stall` aborts the link and refuses the standby's reconnections, and
nothing the primary commits afterwards reaches the standby.

Every step is verified before a test relies on it (``FaultNotVerified`` otherwise): the
standby streams (``pg_stat_replication``, ``sync`` for a synchronous pair), a synchronous
primary's commits really wait for a standby (a canary commit on the primary, made before any
standby exists, is seen held in ``SyncRep`` until the test cancels the wait), a
stall leaves no walsender on the primary, the old primary is gone (its port refuses
connections) before the standby is promoted, and the promoted standby is out of recovery.
:meth:`ReplicatedPair.destroy` stops both servers and the proxy and removes the directory;
the machine's own PostgreSQL (5432) is never touched.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ._private_postgres import (
    DATABASE,
    FaultNotVerified,
    PrivatePostgres,
    _free_port,
    bindir,
    refused,
)
from ._proxy import TCPProxy
from ._services import IN_CI
from ._wait import budget, wait_until

STANDBY_NAME = "standby1"  # the standby's cluster_name: its walreceiver's application_name
#: Settings of a primary whose commits wait for the standby (flushed there).
SYNCHRONOUS = {"synchronous_standby_names": f"'FIRST 1 ({STANDBY_NAME})'",
               "synchronous_commit": "on"}
SERVER_WAIT = 30.0


def require_binaries() -> Path:
    """The server binaries' directory; skipped locally, a failure under ``CI=true``."""
    found = bindir()
    missing = [tool for tool in ("initdb", "pg_ctl", "pg_basebackup")
               if found is None or not (found / tool).exists()]
    if found is None or missing:
        message = f"PostgreSQL server binaries missing: {', '.join(missing)}"
        if IN_CI:
            pytest.fail(message + " (CI=true: service-backed tests never skip)")
        pytest.skip(message)
    return found


def connect(pg: PrivatePostgres, **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit connection of the test's own (its commits never wait for a standby)."""
    kwargs.setdefault("options", "-c synchronous_commit=local")
    return psycopg.connect(pg.dsn, autocommit=True, connect_timeout=10, **kwargs)


def scalar(pg: PrivatePostgres, sql: str, *params: Any) -> Any:
    with connect(pg) as conn:
        row = conn.execute(sql, params or None).fetchone()
    assert row is not None
    return row[0]


class Cluster(PrivatePostgres):
    """One server of the pair, in ``<top>/<name>``, owned by the ``postgres`` user."""

    def __init__(self, top: Path, name: str, bin_dir: Path) -> None:
        root = top / name
        root.mkdir()
        super().__init__(root, bin_dir, _free_port())
        self.sockets.mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (root, self.sockets):
                os.chown(path, owner.pw_uid, owner.pw_gid)

    def configure(self, settings: dict[str, str]) -> None:
        lines = [f"port = {self.port}", "listen_addresses = '127.0.0.1'",
                 f"unix_socket_directories = '{self.sockets}'", "fsync = off",
                 *(f"{name} = {value}" for name, value in settings.items())]
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n" + "\n".join(lines) + "\n")

    def tool(self, name: str, *args: str) -> None:
        self._run(name, *args, timeout=120)

    def init(self, settings: dict[str, str]) -> None:
        """``initdb``, configure, start, and create the ``test`` database (its commit local:
        a synchronous primary has no standby yet)."""
        self.tool("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self.configure(settings)
        self.start()
        with connect(self, dbname="postgres") as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def destroy_server(self) -> None:
        if self.postmaster_pid() is not None:
            with contextlib.suppress(Exception):
                self.stop("immediate")


def _top_directory() -> Path:
    top = Path(tempfile.mkdtemp(prefix="idempotent-tasks-pgrepl-"))
    os.chmod(top, 0o755)  # the postgres user enters it; the servers' roots are its own
    return top


class ReplicatedPair:
    """A primary, its standby and the proxy between them (see the module docstring)."""

    def __init__(self, bin_dir: Path, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.top = _top_directory()
        try:
            self.primary = Cluster(self.top, "primary", bin_dir)
            self.standby = Cluster(self.top, "standby", bin_dir)
        except BaseException:
            shutil.rmtree(self.top, ignore_errors=True)
            raise
        self.proxy = TCPProxy(self.primary.port)

    def build(self) -> None:
        primary, standby = self.primary, self.standby
        primary.init(SYNCHRONOUS if self.synchronous else {})
        if self.synchronous:
            self._verify_commits_wait()
        self.proxy.start()
        standby.tool("pg_basebackup", "-D", str(standby.data), "-h", "127.0.0.1",
                     "-p", str(self.proxy.port), "-U", "postgres", "-R", "-X", "stream",
                     "-c", "fast", "--no-sync")
        # Promoted, it has no standby of its own: its commits must not wait for one.
        standby.configure({"cluster_name": f"'{STANDBY_NAME}'",
                           "synchronous_standby_names": "''"})
        standby.start()
        state = "sync" if self.synchronous else "async"
        wait_until(lambda: self.replication_state() == ("streaming", state),
                   f"the standby streaming ({state})", SERVER_WAIT)

    def _verify_commits_wait(self) -> None:
        """A commit on the primary, with no standby yet, must wait in ``SyncRep`` (seen in
        ``pg_stat_activity``); ``pg_cancel_backend`` then ends the wait (the commit stands)."""
        with connect(self.primary, options="") as conn:
            pid = conn.info.backend_pid
            canary = threading.Thread(
                target=conn.execute, args=("CREATE TABLE replication_canary ()",), daemon=True)
            canary.start()
            try:
                wait_until(lambda: scalar(self.primary, "SELECT count(*) FROM pg_stat_activity"
                                          " WHERE pid = %s AND wait_event = 'SyncRep'", pid),
                           "a commit on the primary waiting for a standby", SERVER_WAIT)
            finally:
                scalar(self.primary, "SELECT pg_cancel_backend(%s)", pid)
                canary.join(budget(SERVER_WAIT))
        if canary.is_alive():
            raise FaultNotVerified("the canary commit did not end when its wait was cancelled")

    # -- state -------------------------------------------------------------------------------
    def replication_state(self) -> tuple[str, str] | None:
        with connect(self.primary) as conn:
            row = conn.execute("SELECT state, sync_state FROM pg_stat_replication "
                               "WHERE application_name = %s", (STANDBY_NAME,)).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def walsenders(self) -> int:
        return int(scalar(self.primary, "SELECT count(*) FROM pg_stat_replication"))

    def wait_caught_up(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        lsn = scalar(self.primary, "SELECT pg_current_wal_lsn()::text")
        wait_until(lambda: scalar(self.standby, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                  lsn),
                   f"the standby replaying up to {lsn}", SERVER_WAIT)

    # -- faults ------------------------------------------------------------------------------
    def stall(self) -> None:
        """Cut the replication link: nothing committed from now on reaches the standby."""
        self.proxy.drop()
        if self.proxy.open_connections:
            raise FaultNotVerified("the proxy still forwards a connection after drop()")
        wait_until(lambda: self.walsenders() == 0, "the primary's walsender gone", SERVER_WAIT)

    def fail_over(self) -> None:
        """The primary dies (immediate stop, verified: its port refuses connections), then
        the standby is promoted (verified: out of recovery)."""
        self.primary.stop("immediate")
        if refused(self.primary.port) is None:
            raise FaultNotVerified("the old primary still accepts connections")
        self.standby.tool("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        if scalar(self.standby, "SELECT pg_is_in_recovery()"):
            raise FaultNotVerified("the promoted standby is still in recovery")

    def destroy(self) -> None:
        self.proxy.stop()
        self.standby.destroy_server()
        self.primary.destroy_server()
        shutil.rmtree(self.top, ignore_errors=True)


@contextlib.contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[ReplicatedPair]:
    pair = ReplicatedPair(require_binaries(), synchronous=synchronous)
    try:
        pair.build()
        yield pair
    finally:
        pair.destroy()


@contextlib.contextmanager
def standalone_server() -> Iterator[Cluster]:
    """One private server with default settings (no standby), removed afterwards."""
    top = _top_directory()
    try:
        server = Cluster(top, "server", require_binaries())
        try:
            server.init({})
            yield server
        finally:
            server.destroy_server()
    finally:
        shutil.rmtree(top, ignore_errors=True)
