"""The Redis store's hot path: one held connection per thread.

A call through ``redis.Redis.execute_command`` checks a connection out of the pool (a lock
and a readiness poll of the socket), runs the client's dispatch layer, and checks it back
in: a cost of its own per command, paid twice per first delivery (docs/performance.md has
the figures).  ``ThreadConnections`` keeps one
``redis.Connection`` per thread instead, built from the client pool's own class and
settings (URL, credentials, TLS, timeouts), and sends each script with
``send_packed_command`` + ``read_response``.  redis-py still parses, connects and
reconnects; only the per-call checkout and dispatch are skipped.  With hiredis installed a
command is packed by ``hiredis.pack_command`` in one C call (redis-py's own packer encodes
each argument in Python first: ~10 µs for a claim's eleven arguments); the bytes are the
same (str as UTF-8, numbers as ``repr``), so it is used only with the default UTF-8
encoding, and never for a command whose name has a space (``SCRIPT LOAD``).

* Failures: redis-py disconnects a connection on any error while sending or reading
  (timeouts, resets, interrupts), so a half-read reply never reaches the next call; the
  next call connects afresh.  Nothing is retried here: a retried write could report a
  stale outcome (the handler has its own bounded retry).
* Threads: a connection is used by its own thread only; it is closed when its thread ends
  (the thread-local is released) or by :meth:`close`.
* Fork: a child process never uses its parent's socket; it opens its own on first use
  (an ``os.register_at_fork`` hook forgets the parent's connections in the child, so no
  call pays for a process check).
* Not used under gevent or eventlet monkey-patching (a greenlet per task would connect once
  per task): the store then goes through the client's pool as before.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any


class ThreadConnections:
    """One lazily opened ``connection_class(**connection_kwargs)`` per thread."""

    def __init__(self, connection_class: Any, connection_kwargs: dict[str, Any]) -> None:
        self._class = connection_class
        self._kwargs = dict(connection_kwargs)
        #: redis-py's health check (a PING after ``health_check_interval`` idle seconds) is
        #: kept only when the client asked for it: otherwise it is a no-op call per command.
        self._check_health = bool(self._kwargs.get("health_check_interval"))
        self._local = threading.local()
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        #: hiredis's packer, called directly when it packs exactly as redis-py would here.
        self._pack = hiredis_packer(self._kwargs)
        _watch_forks(self)

    def execute(self, *args: Any) -> Any:
        """Send one command on this thread's connection and return its reply (server error
        replies are raised as redis-py's ``ResponseError`` subclasses)."""
        conn = self._ready()
        conn.send_packed_command(self._packed(conn, args), check_health=self._check_health)
        return conn.read_response()

    def execute_many(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write on this thread's connection and read every reply
        (one round trip).  Error replies are returned in place, not raised: all replies are
        read either way, so the connection stays in step."""
        from redis.exceptions import ResponseError

        conn = self._ready()
        packed = (
            conn.pack_commands(commands) if self._pack is None
            else [b"".join(chunk for c in commands for chunk in self._packed(conn, c))]
        )
        conn.send_packed_command(packed, check_health=self._check_health)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

    def _packed(self, conn: Any, args: tuple[Any, ...]) -> list[bytes]:
        """``args`` packed, as chunks for ``send_packed_command``; a command named in two
        words (``SCRIPT LOAD``) is split by redis-py's packer, so it packs those."""
        pack = self._pack
        if pack is None or " " in args[0]:
            chunks: list[bytes] = conn.pack_command(*args)
            return chunks
        return [pack(args)]

    def _ready(self) -> Any:
        """This thread's connection, fit to send on.  As redis-py's pool does at checkout: a
        connection with something to read before we sent anything was closed by the server
        (a restart, a dropped link) or is out of step; it is reconnected first, so the call
        after a lost connection works instead of failing on the dead socket."""
        from redis.exceptions import ConnectionError, TimeoutError

        conn = getattr(self._local, "conn", None)
        if conn is None:
            return self._open()
        try:
            if conn.can_read():
                conn.disconnect()
        except (ConnectionError, TimeoutError, OSError):
            conn.disconnect()
        return conn

    def _open(self) -> Any:
        conn = self._class(**self._kwargs)
        with self._lock:
            self._all.add(conn)
        self._local.conn = conn
        return conn

    def close(self) -> None:
        """Disconnect every thread's connection; each reconnects on its next use."""
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            conn.disconnect()

    def _forget(self) -> None:
        """In a forked child: drop the parent's connections unused (redis-py shuts a socket
        down only in the process that opened it), so the child opens its own."""
        self._local = threading.local()
        self._all = weakref.WeakSet()
        self._lock = threading.Lock()


#: Every ThreadConnections of this process, for the fork hook below.
_LIVE: weakref.WeakSet[ThreadConnections] = weakref.WeakSet()


def _watch_forks(held: ThreadConnections) -> None:
    """Register the fork hook with the first ThreadConnections (not at import time)."""
    if not _FORK_HOOK:
        _FORK_HOOK.add(_after_fork_in_child)
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _LIVE.add(held)


def _after_fork_in_child() -> None:
    for held in list(_LIVE):
        held._forget()


#: The hook, once registered (``os.register_at_fork`` cannot unregister).
_FORK_HOOK: set[object] = set()


def hiredis_packer(kwargs: dict[str, Any]) -> Callable[[tuple[Any, ...]], bytes] | None:
    """``hiredis.pack_command`` when it packs a command exactly as the connection would:
    redis-py's own packer runs its encoder over every argument in Python before handing them
    to the same function, about 0.5 µs an argument — a batch script call has ~800 (for
    speed: a batch claim is packed ~4x faster).  hiredis 3 encodes ``str`` as UTF-8 and
    numbers as their ``repr``, as redis-py's encoder does with its default ``utf-8``
    encoding; with another encoding, or an older hiredis, redis-py packs."""
    encoding = str(kwargs.get("encoding", "utf-8")).lower().replace("-", "").replace("_", "")
    if encoding != "utf8" or kwargs.get("encoding_errors", "strict") != "strict":
        return None
    try:
        import hiredis
    except ImportError:
        return None
    pack = getattr(hiredis, "pack_command", None)
    major = str(getattr(hiredis, "__version__", "0")).split(".")[0]
    if pack is None or not major.isdigit() or int(major) < 3:
        return None
    packer: Callable[[tuple[Any, ...]], bytes] = pack
    return packer


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
