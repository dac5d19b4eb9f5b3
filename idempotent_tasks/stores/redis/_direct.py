"""The Redis store's hot path: one held connection per thread.

A call through ``redis.Redis.execute_command`` checks a connection out of the pool (a lock
and a readiness poll of the socket), runs the client's dispatch layer, and checks it back
in: on this project's machine that is ~15-20 µs per command, about a tenth of a loopback
round trip, paid twice per first delivery.  ``ThreadConnections`` keeps one
``redis.Connection`` per thread instead, built from the client pool's own class and
settings (URL, credentials, TLS, timeouts), and sends each script with
``send_command`` + ``read_response``.  redis-py still packs, parses, connects and
reconnects; only the per-call checkout and dispatch are skipped.

* Failures: redis-py disconnects a connection on any error while sending or reading
  (timeouts, resets, interrupts), so a half-read reply never reaches the next call; the
  next call connects afresh.  Nothing is retried here: a retried write could report a
  stale outcome (the handler has its own bounded retry).
* Threads: a connection is used by its own thread only; it is closed when its thread ends
  (the thread-local is released) or by :meth:`close`.
* Fork: a child process never uses its parent's socket; it opens its own on first use.
* Not used under gevent or eventlet monkey-patching (a greenlet per task would connect once
  per task): the store then goes through the client's pool as before.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any


class ThreadConnections:
    """One lazily opened ``connection_class(**connection_kwargs)`` per thread."""

    def __init__(self, connection_class: Any, connection_kwargs: dict[str, Any]) -> None:
        self._class = connection_class
        self._kwargs = dict(connection_kwargs)
        self._local = threading.local()
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def execute(self, *args: Any) -> Any:
        """Send one command on this thread's connection and return its reply (server error
        replies are raised as redis-py's ``ResponseError`` subclasses)."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._open()
        conn.send_command(*args)
        return conn.read_response()

    def execute_many(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write on this thread's connection and read every reply
        (one round trip).  Error replies are returned in place, not raised: all replies are
        read either way, so the connection stays in step."""
        from redis.exceptions import ResponseError

        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._open()
        conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

    def _open(self) -> Any:
        conn = self._class(**self._kwargs)
        with self._lock:
            self._all.add(conn)
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def close(self) -> None:
        """Disconnect every thread's connection; each reconnects on its next use."""
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            conn.disconnect()


def thread_connections(client: Any) -> ThreadConnections | None:
    """Held connections for a standalone ``redis.Redis`` with a plain connection pool;
    ``None`` (use the client as is) for Cluster, Sentinel, blocking or client-side-caching
    pools, whose connections the pool must manage itself, and under gevent or eventlet
    monkey-patching, where a "thread" is a greenlet that may live for one task only."""
    import redis

    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.Redis) or type(pool) is not redis.ConnectionPool:
        return None
    if green_threads():
        return None
    if getattr(pool, "cache", None) is not None:
        return None
    return ThreadConnections(pool.connection_class, pool.connection_kwargs)


def green_threads() -> bool:
    """Is ``threading`` monkey-patched into greenlets (gevent, eventlet)?  Then a held
    connection per "thread" would be one connect and disconnect per short-lived greenlet."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return True
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    return bool(
        eventlet_patcher is not None and eventlet_patcher.is_monkey_patched("thread")
    )
