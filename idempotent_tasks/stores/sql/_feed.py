"""PostgreSQL's change feed: ``LISTEN``/``NOTIFY`` behind event-driven waiting
(``stores.changes``), for ``SQLStore`` (this module) and ``AsyncSQLStore`` (``async_sql``).

* Channel: ``<table_prefix>_changes`` (the prefix is a validated identifier of at most 40
  characters, so the channel is a valid, bounded identifier; stores sharing tables share it).
  Payload: the scope's digest (``stores/_feed.py``: 32 hex characters): no key, tenant or
  operation travels in a notification, and a payload never nears PostgreSQL's 8000-byte
  limit.
* ``announce_change(scope)``: ``SELECT pg_notify(channel, payload)`` on one of the store's
  own autocommit connections, one round trip, delivered once that statement commits (it
  is called after the outcome it announces was written).  It works through PgBouncer.
* ``wait_for_change(scope, timeout=)``: the waiter registers an event under the payload
  (``stores/_feed.py``'s ``Waiters``) and blocks on it.  One listener per store and
  process — a connection of its own (autocommit, ``LISTEN``), read by one daemon thread
  through psycopg's ``Connection.notifies(timeout=...)`` — sets the events registered for
  each payload it receives, so a waiter wakes only for its own scope.  The listener starts
  with the first wait, which does not return before ``LISTEN`` is active (or its timeout
  passed).
* Failures: a lost listener connection is logged (``change_feed_lost``) and reopened with
  a doubling delay; meanwhile waiters sleep to their timeout (the polling they replace).
  Once listening again it wakes every waiter, since announcements made meanwhile were
  lost (a false wake-up costs one look at the record).  A quiet listener checks its link
  every ``PING_INTERVAL`` seconds under the store's ``socket_timeout`` watchdog.
  ``close()`` stops the thread and closes the connection; a later wait starts afresh.
* The listener needs a real server session: behind PgBouncer in transaction mode
  (``prepare=False``) ``LISTEN`` does not work, so such a store has no feed unless given
  ``listen_url=`` (a direct PostgreSQL URL for the listener alone).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from ..._core.errors import ConfigurationError
from ..._core.logging import default_logger
from ..._core.records import Scope
from .._feed import Waiters, scope_digest
from ._connections import _break_connection, _Watchdog
from ._plans import ROWS, Plan

#: Seconds the listener blocks on its connection before checking whether it should stop.
LISTEN_TICK: Final = 1.0
#: Seconds of silence after which the listener checks that its link is alive.
PING_INTERVAL: Final = 15.0
#: The listener's reconnection delay: the first, doubling up to the last.
RECONNECT_DELAYS: Final = (0.05, 2.0)
_NOTIFY: Final = "SELECT pg_notify(%(channel)s, %(payload)s)"
_log = default_logger()


def channel_name(table_prefix: str) -> str:
    """The store's notification channel (an identifier: the prefix is validated)."""
    return f"{table_prefix}_changes"


def listener_name(channel: str) -> str:
    """The listener connection's ``application_name`` (``pg_stat_activity``)."""
    return f"idempotent-tasks LISTEN {channel}"[:63]


def notify_plan(channel: str, scope: Scope) -> Plan[None]:
    """``announce_change``: one ``pg_notify`` statement."""
    yield _NOTIFY, {"channel": channel, "payload": scope_digest(scope)}, ROWS


def listen_sql(channel: str) -> str:
    """``LISTEN`` for ``channel`` (an identifier of letters, digits and underscores)."""
    return f'LISTEN "{channel}"'


def listen_conninfo(listen_url: str) -> str:
    """The libpq URL of ``listen_url`` (any ``postgresql[+driver]://`` URL)."""
    try:
        url = sa.make_url(listen_url)
    except (sa_exc.ArgumentError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"invalid listen_url: {exc}") from exc
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"listen_url must be a PostgreSQL URL (postgresql://…), not {url.drivername!r}"
        )
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def sync_feed(
    engine: Engine, *, table_prefix: str, listen_url: str | None, prepare: bool,
    connect_timeout: float, watchdog: _Watchdog | None,
) -> ChangeFeed | None:
    """SQLStore's feed on PostgreSQL, or None where ``LISTEN`` cannot work (``prepare=False``
    says PgBouncer in transaction mode, and no ``listen_url`` names a direct session).
    The listener connects like the store's engine (its connect arguments and events), or
    to ``listen_url``."""
    if listen_url is None and not prepare:
        return None
    channel = channel_name(table_prefix)
    name = listener_name(channel)
    if listen_url is None:
        def connect() -> Any:
            return _detached(engine, name)
    else:
        conninfo = listen_conninfo(listen_url)

        def connect() -> Any:
            import psycopg

            return psycopg.connect(conninfo, autocommit=True, application_name=name,
                                   connect_timeout=max(1, math.ceil(connect_timeout)))

    def ping(conn: Any) -> None:
        armed = watchdog.arm(conn) if watchdog is not None else None
        conn.execute("SELECT 1")
        if armed is not None and watchdog is not None and not watchdog.disarm(armed):
            raise TimeoutError("the listener's link check outlived socket_timeout")

    return ChangeFeed(connect, channel, ping=ping, interrupt=_break_connection)


def _detached(engine: Engine, name: str) -> Any:
    """A connection of the engine's, taken out of its pool for good (SQLAlchemy's
    documented ``detach()``): the listener's session is never handed to anything else."""
    fairy = engine.raw_connection()
    dbapi: Any = fairy.driver_connection
    fairy.detach()
    try:
        dbapi.autocommit = True
        dbapi.execute("SELECT set_config('application_name', %s, false)", [name])
    except BaseException:
        with contextlib.suppress(Exception):
            dbapi.close()
        raise
    return dbapi


class ChangeFeed:
    """The waiters of one store in this process, and its listener (module docstring)."""

    def __init__(
        self, connect: Callable[[], Any], channel: str, *,
        ping: Callable[[Any], None], interrupt: Callable[[Any], None],
    ) -> None:
        self.channel = channel
        self._connect = connect
        self._ping = ping
        self._interrupt = interrupt
        self._lock = threading.Lock()
        self.waiters = Waiters()
        self._listener: _Listener | None = None
        self._pid = os.getpid()

    def wait(self, scope: Scope, *, timeout: float) -> bool:
        """Block until the scope's payload arrives or ``timeout`` passes; the first wait
        does not return before ``LISTEN`` is active (or its timeout passed)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            listener = self._running()
        if not listener.ready.is_set():  # nothing is heard before LISTEN
            listener.ready.wait(max(0.0, timeout))
        return self.waiters.wait(scope_digest(scope), max(0.0, deadline - time.monotonic()))

    def _running(self) -> _Listener:
        """The listener, started on first use (and afresh in a forked child, whose copy of
        the parent's thread does not run: the parent's connection is left untouched)."""
        if self._pid != os.getpid():
            self._pid, self._listener, self.waiters = os.getpid(), None, Waiters()
        listener = self._listener
        if listener is None:
            listener = self._listener = _Listener(self)
            listener.thread.start()
        return listener

    @property
    def listening(self) -> bool:
        """Whether a listener runs with ``LISTEN`` active (for tests and operators)."""
        listener = self._listener
        return listener is not None and listener.ready.is_set()

    def close(self) -> None:
        """Stop the listener thread (joined) and close its connection."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None and self._pid == os.getpid():
            listener.stop()


class _Listener:
    """One listening connection and the daemon thread reading it."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.feed = feed
        self.ready = threading.Event()
        self.connection: Any = None
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"idempotent-tasks-listen-{feed.channel}", daemon=True
        )

    def stop(self) -> None:
        self._stop.set()
        self.feed._interrupt(self.connection)  # the blocked read fails at once
        self.thread.join()

    def _run(self) -> None:
        delay, opened = RECONNECT_DELAYS[0], 0
        while not self._stop.is_set():
            try:
                self.connection = conn = self.feed._connect()
                conn.execute(listen_sql(self.feed.channel))
                if opened:  # what was announced while we were away is lost: look again
                    self.feed.waiters.wake_all()
                opened += 1
                self.ready.set()
                delay = RECONNECT_DELAYS[0]
                self._listen(conn)
            except Exception as exc:
                if not self._stop.is_set():
                    _log.warning("change_feed_lost", store="postgresql",
                                 channel=self.feed.channel, error=repr(exc))
            finally:
                self.ready.clear()
                self._close()
            self._stop.wait(delay)
            delay = min(delay * 2, RECONNECT_DELAYS[1])

    def _listen(self, conn: Any) -> None:
        quiet_since = time.monotonic()
        while not self._stop.is_set():
            for note in conn.notifies(timeout=LISTEN_TICK):
                self.feed.waiters.wake(note.payload)
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since >= PING_INTERVAL:
                self.feed._ping(conn)
                quiet_since = time.monotonic()

    def _close(self) -> None:
        conn, self.connection = self.connection, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
