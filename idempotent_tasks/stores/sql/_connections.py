"""SQLStore's connections: the raw DBAPI free list, the statement watchdog, engines."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from ..._core.errors import ConfigurationError

_PG_DRIVERS: Final = frozenset({"postgresql", "postgres", "postgresql+psycopg"})
_SQLITE_DRIVERS: Final = frozenset({"sqlite", "sqlite+pysqlite"})
#: ``mysql://`` means PyMySQL; ``mariadb+pymysql://`` selects SQLAlchemy's MariaDB dialect.
_MYSQL_DRIVERS: Final = {
    "mysql": "mysql+pymysql", "mysql+pymysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql", "mariadb+pymysql": "mariadb+pymysql",
}


# -- raw connections --------------------------------------------------------------------------
#: Forks seen by this process (its children count on from their parent's value): a pool
#: compares it with the value it was made under instead of calling ``os.getpid()``, a
#: system call on every statement.  The hook is registered by the first pool, not on import.
_forks = 0
_fork_hook: list[bool] = []


def _forked() -> None:
    global _forks
    _forks += 1


def _watch_forks() -> None:
    # Two pools racing here may both register: a child then counts two, still "forked".
    if not _fork_hook:
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_forked)


@dataclass(slots=True, eq=False)
class _Raw:
    """A DBAPI connection checked out of the engine's pool and kept in our free list."""

    fairy: Any  # sqlalchemy PoolProxiedConnection
    dbapi: Any
    cursor: Any
    saved: Any  # the driver setting we changed (autocommit / isolation_level), restored on return


class _RawPool:
    """A LIFO free list of autocommit DBAPI connections over the engine's pool.

    Checking a connection out of SQLAlchemy's pool and resetting it on return costs more than
    the statements themselves on the hot path, so connections stay checked out while idle
    here (at most ``size``).  A connection that failed is invalidated; a lost connection
    drains the whole list and the engine pool's idle connections, since they died with it.
    """

    def __init__(
        self,
        engine: Engine,
        size: int,
        adopt: Callable[[Any, dict[Any, Any]], Any],
        restore: Callable[[Any, Any], None],
    ) -> None:
        self._engine = engine
        self._size = size
        self._adopt = adopt
        self._restore = restore
        self._idle: deque[_Raw] = deque()
        _watch_forks()
        self._forks = _forks
        self._orphans: list[_Raw] = []

    def forked(self) -> bool:
        """Whether this process is a fork child of the one the pool last ran in."""
        return self._forks != _forks

    def acquire(self) -> _Raw:
        if self._forks != _forks:  # inlined ``forked()``: this runs on every statement
            self.after_fork()
        try:
            return self._idle.pop()
        except IndexError:
            return self._open()

    def _open(self) -> _Raw:
        fairy = self._engine.raw_connection()
        try:
            dbapi: Any = fairy.driver_connection
            saved = self._adopt(dbapi, fairy.info)
            return _Raw(fairy, dbapi, dbapi.cursor(), saved)
        except BaseException:
            fairy.invalidate()
            raise

    def release(self, raw: _Raw) -> None:
        if len(self._idle) < self._size:
            self._idle.append(raw)
        else:
            self._give_back(raw)

    def _give_back(self, raw: _Raw) -> None:
        try:
            self._restore(raw.dbapi, raw.saved)
            raw.fairy.close()
        except Exception:
            raw.fairy.invalidate()

    def discard(self, raw: _Raw, *, lost: bool) -> None:
        """Drop a connection whose state is unknown after an error."""
        with contextlib.suppress(Exception):
            raw.fairy.invalidate()
        if lost:
            self.drain(invalidate=True)
            with contextlib.suppress(Exception):
                self._engine.pool.dispose()  # idle pooled connections died with this one

    def drain(self, *, invalidate: bool = False) -> None:
        while True:
            try:
                raw = self._idle.pop()
            except IndexError:
                return
            if invalidate:
                with contextlib.suppress(Exception):
                    raw.fairy.invalidate()
            else:
                self._give_back(raw)

    def after_fork(self) -> None:
        """In a forked child: never touch the parent's sockets/handles, start afresh."""
        self._orphans.extend(self._idle)  # keep them referenced: no finaliser may close them
        self._idle = deque()
        self._forks = _forks
        self._engine.dispose(close=False)


def _pg_adopt(dbapi: Any, info: dict[Any, Any]) -> Any:
    saved = dbapi.autocommit
    dbapi.autocommit = True
    return saved


def _pg_restore(dbapi: Any, saved: Any) -> None:
    dbapi.autocommit = saved


def _sqlite_restore(dbapi: Any, saved: Any) -> None:
    if dbapi.in_transaction:
        dbapi.rollback()
    dbapi.isolation_level = saved



# -- a deadline for every statement -----------------------------------------------------------
class _Watchdog:
    """Breaks a PostgreSQL connection whose call outlived ``timeout`` seconds.

    psycopg has no client-side read timeout for an established connection: on a link that
    goes silent (a partition, a stuck proxy) a call would block until the kernel gives up,
    minutes later.  One daemon thread watches the calls in flight; when one passes its
    deadline it shuts the socket down, the blocked call fails, and the store translates that
    into ``STORE_UNAVAILABLE`` and discards the connection.  Arming costs a dict write.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._armed: dict[int, tuple[float, Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, dbapi: Any) -> int:
        ident = next(self._ids)
        self._armed[ident] = (time.monotonic() + self.timeout, dbapi)
        if self._thread is None:
            self._start()
        return ident

    def disarm(self, ident: int) -> bool:
        """False when the deadline already fired: the connection is broken, drop it."""
        return self._armed.pop(ident, None) is not None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="idempotent-tasks-sql-watchdog", daemon=True
                )
                self._thread.start()

    def _watch(self) -> None:
        tick = min(0.25, self.timeout / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            for ident, (deadline, dbapi) in list(self._armed.items()):
                if deadline <= now and self._armed.pop(ident, None) is not None:
                    _break_connection(dbapi)


def _break_connection(dbapi: Any) -> None:
    """Shut the socket down under a blocked psycopg call (it then fails at once)."""
    with contextlib.suppress(Exception):
        fd = dbapi.fileno()  # psycopg's documented descriptor of the connection's socket
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()



def _always() -> bool:
    return True


def _sqlite_configure(dbapi: Any, info: dict[Any, Any], timeout: float) -> None:
    """WAL lets readers run beside the one writer; NORMAL sync is durable across process
    crashes (WAL); the busy timeout makes lock waits block, not fail, up to ``timeout``."""
    if info.get("idempotent_tasks_sqlite"):
        return
    dbapi.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    _enable_wal(dbapi, timeout)
    dbapi.execute("PRAGMA synchronous = NORMAL")
    info["idempotent_tasks_sqlite"] = True


#: How the WAL switch waits between attempts (a module attribute, so tests can watch it).
_wait: Callable[[float], None] = time.sleep


def _enable_wal(dbapi: Any, timeout: float) -> None:
    """Switch a new database file to WAL.  The switch needs the exclusive lock and fails at
    once, without the busy handler, while another connection holds a lock (several stores
    opening the same new file together do): it is tried again until ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            mode = dbapi.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                dbapi.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        _wait(delay)
        delay = min(delay * 2, 0.1)


def _dialect_name(engine: Engine) -> str:
    dialect = engine.dialect
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        return "postgresql"
    if dialect.name == "sqlite" and dialect.driver == "pysqlite":
        return "sqlite"
    if dialect.name in ("mysql", "mariadb") and dialect.driver == "pymysql":
        return "mysql"
    raise ConfigurationError(
        f"SQLStore supports PostgreSQL through psycopg 3, MySQL/MariaDB through PyMySQL and "
        f"SQLite through sqlite3, not {dialect.name}+{dialect.driver}"
    )


def _make_engine(
    url_or_engine: str | Engine, timeout: float, pool_size: int,
    socket_timeout: float | None = None, *, prepare: bool = True,
) -> Engine:
    """Build (never connect) an engine; an Engine passed in is used as it is."""
    if isinstance(url_or_engine, Engine):
        return url_or_engine
    try:
        url = sa.make_url(url_or_engine)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"invalid SQLStore URL: {exc}") from exc
    pool: dict[str, Any] = {
        "pool_size": pool_size,
        "max_overflow": pool_size,
        "pool_timeout": timeout,
        "pool_pre_ping": True,
    }
    if url.drivername in _PG_DRIVERS:
        url = url.set(drivername="postgresql+psycopg")
        connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(timeout))}
        if not prepare:  # PgBouncer in transaction mode: no named prepared statements
            connect_args["prepare_threshold"] = None
    elif url.drivername in _SQLITE_DRIVERS:
        if url.database in (None, "", ":memory:") or "mode=memory" in str(url):
            raise ConfigurationError(
                "SQLStore needs a SQLite file (sqlite:///path/idem.db): an in-memory database "
                "is private to one connection; use MemoryStore for tests"
            )
        connect_args = {"timeout": timeout, "check_same_thread": False}
    elif url.drivername in _MYSQL_DRIVERS:
        from ._mysql_setup import connect_args as mysql_args

        url = url.set(drivername=_MYSQL_DRIVERS[url.drivername])
        connect_args = mysql_args(timeout, socket_timeout)
        pool["isolation_level"] = "READ COMMITTED"  # see _mysql.py: no gap locks
    else:
        raise ConfigurationError(
            f"unsupported SQLStore URL scheme {url.drivername!r}: use postgresql+psycopg://, "
            "mysql+pymysql:// or sqlite:///"
        )
    try:
        engine = sa.create_engine(url, connect_args=connect_args, **pool)
    except ImportError as exc:
        needs = (
            "MySQL/MariaDB support needs PyMySQL: pip install 'idempotent-tasks[mysql]'"
            if url.drivername in _MYSQL_DRIVERS.values()
            else "PostgreSQL support needs psycopg 3: pip install 'idempotent-tasks[postgres]'"
        )
        raise ConfigurationError(needs) from exc
    if url.drivername in _MYSQL_DRIVERS.values():
        from ._mysql_setup import bound_handshake

        bound_handshake(engine)
    return engine
