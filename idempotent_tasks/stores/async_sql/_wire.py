"""AsyncSQLStore's statements on the wire: libpq driven directly, one reader per connection.

``AsyncConnection.execute`` builds a cursor and a transformer, converts and validates the
query, and waits for the socket by registering it with the event loop and removing it again
(two ``epoll_ctl`` calls) under a timer — for every statement.  On this project's 2-core
machine that is most of a claim's client CPU.  The store's statements are few, fixed and
single: here each connection keeps one transformer, its socket stays registered with the
loop while the store holds it (the reader wakes whoever waits for the reply), every
statement is prepared once per connection (named ``it_<n>``) and sent with
``send_query_prepared``, results come back in binary and are loaded by psycopg's own
(C) loaders.  Parameters are dumped by psycopg's own dumpers, so the values, their types and
the rows are exactly psycopg's; errors are psycopg's exceptions (``error_from_result``).

* Deadline: :class:`Watchdog`, one timer per store (not one per statement) on the oldest
  statement in flight; a statement older than ``socket_timeout`` gets its socket shut down
  (the wait then fails at once) and its connection is marked ``fired``.
* Idle: a registered idle connection that turns readable is read at once; a closed or
  broken one is marked ``broken`` and unregistered (the store discards it on next use).
* Anything else that uses the connection through psycopg (a body transaction, the pool)
  must ``detach`` it first: the loop has one reader per socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import select
from collections.abc import Generator, Mapping
from functools import lru_cache
from typing import Any, Final, NamedTuple

from psycopg import errors as e
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer

from ..sql._connections import _break_connection

_WAIT_R: Final = 1
_WAIT_W: Final = 2
_READY_R: Final = 1
_READY_W: Final = 2
_BINARY: Final = pq.Format.BINARY
_FATAL: Final = pq.ExecStatus.FATAL_ERROR
#: Prepared statements kept per connection (a few per statement: psycopg picks an integer's
#: type by its size); beyond that a statement is sent unprepared.
_MAX_PREPARED: Final = 256
_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s|%%")
#: Prepared statement names, unique in the process (``it_<n>``): a connection that went back
#: to the pool and came out again keeps the ones it has, and never sees a name twice.
_NAMES: Final = itertools.count()


class Query(NamedTuple):
    """A ``%(name)s`` statement as libpq takes it: ``$n`` placeholders, names in order."""

    sql: bytes
    names: tuple[str, ...]


@lru_cache(maxsize=512)
def query_of(sql: str) -> Query:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return Query(_PLACEHOLDER.sub(number, sql).encode(), tuple(names))


class Wire:
    """One connection the store holds, and its statements (see the module docstring)."""

    __slots__ = (
        "_attached", "_fd", "_loop", "_prepared", "_tx", "_waiter", "broken", "conn", "fired",
        "pgconn", "started",
    )

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self._loop = loop
        self._fd: int = self.pgconn.socket
        self._tx = Transformer(conn)
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._waiter: asyncio.Future[int] | None = None
        self._attached = False
        #: An error seen while idle (the server closed it): discard, never reuse.
        self.broken = False
        #: Set by the watchdog when a statement outlived the deadline.
        self.fired = False
        #: When the statement in flight started (loop time), for the watchdog.
        self.started = 0.0
        self.attach()

    # -- the loop's reader ----------------------------------------------------------------
    def attach(self) -> None:
        if not self._attached and not self.broken:
            self._loop.add_reader(self._fd, self._readable)
            self._attached = True

    def detach(self) -> None:
        """Unregister the socket (before psycopg or the pool use the connection again)."""
        if self._attached:
            self._attached = False
            with contextlib.suppress(Exception):  # the loop may be closed already
                self._loop.remove_reader(self._fd)

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(_READY_R)
            return
        try:  # idle: a notice, or the server went away
            self.pgconn.consume_input()
        except Exception:
            self.broken = True
            self.detach()

    # -- statements -----------------------------------------------------------------------
    async def execute(self, sql: str, params: Mapping[str, Any] | None) -> Any:
        """One statement; its ``PGresult`` (an error result raised as psycopg's error)."""
        query = query_of(sql)
        tx = self._tx
        values = [params[name] for name in query.names] if params else []
        dumped = tx.dump_sequence(values, [PyFormat.AUTO] * len(values)) if values else []
        types, formats = (tuple(tx.types or ()), list(tx.formats or ())) if values else ((), [])
        name = self._prepared.get((query.sql, types))
        pgconn = self.pgconn
        if name is None and len(self._prepared) < _MAX_PREPARED:
            name = await self._prepare(query.sql, types)
        if name is None:
            pgconn.send_query_params(
                query.sql, dumped, param_types=types, param_formats=formats,
                result_format=_BINARY,
            )
        else:
            pgconn.send_query_prepared(name, dumped, param_formats=formats, result_format=_BINARY)
        try:
            return self._checked(await self._drive(generators.execute(pgconn)))
        except e.InvalidSqlStatementName:
            self._prepared.clear()  # the server forgot them (DISCARD ALL): prepare anew next time
            raise

    def rows(self, result: Any) -> list[Any]:
        """The rows of a result, as tuples, loaded the way psycopg loads them."""
        tx = self._tx
        tx.set_pgresult(result)
        rows: list[Any] = tx.load_rows(0, result.ntuples, tuple)
        return rows

    async def _prepare(self, sql: bytes, types: tuple[int, ...]) -> bytes:
        name = b"it_%d" % next(_NAMES)
        self.pgconn.send_prepare(name, sql, param_types=types)
        self._checked(await self._drive(generators.execute(self.pgconn)))
        self._prepared[(sql, types)] = name
        return name

    def _checked(self, results: list[Any]) -> Any:
        for result in results:
            if result.status == _FATAL:
                raise e.error_from_result(result, encoding=self.conn.info.encoding)
        if not results:
            raise e.InterfaceError("the server sent no result")
        return results[-1]

    async def _drive(self, gen: Generator[int, int, Any]) -> Any:
        """Run one of psycopg's libpq generators, waiting on this connection's socket (the
        reader registered with the loop wakes the waiter)."""
        loop = self._loop
        try:
            state = next(gen)
            while True:
                if not self._attached:
                    raise e.OperationalError("the connection was closed")
                if state & _WAIT_W:
                    ready = await self._wait_writable()
                else:
                    waiter: asyncio.Future[int] = loop.create_future()
                    self._waiter = waiter
                    try:
                        ready = await waiter
                    finally:
                        self._waiter = None
                state = gen.send(ready)
        except StopIteration as done:
            return done.value

    async def _wait_writable(self) -> int:
        """The socket's buffer was full (rare for these statements): wait until it drains."""
        readable, writable, _ = select.select([self._fd], [self._fd], [], 0)
        if readable or writable:
            return (_READY_R if readable else 0) | (_READY_W if writable else 0)
        self._loop.add_writer(self._fd, self._writable)
        waiter: asyncio.Future[int] = self._loop.create_future()
        self._waiter = waiter
        try:
            return await waiter
        finally:
            self._waiter = None
            self._loop.remove_writer(self._fd)

    def _writable(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(_READY_W)


class Watchdog:
    """The statements' deadline: one timer on the oldest statement in flight."""

    __slots__ = ("_busy", "_timer", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._busy: set[Wire] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, wire: Wire) -> None:
        loop = wire._loop
        wire.started = now = loop.time()
        self._busy.add(wire)
        if self._timer is None:
            self._timer = loop.call_at(now + self.timeout, self._fire, loop)

    def stop(self, wire: Wire) -> None:
        self._busy.discard(wire)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now, timeout, soonest = loop.time(), self.timeout, None
        for wire in list(self._busy):
            deadline = wire.started + timeout
            if deadline <= now:
                self._busy.discard(wire)
                wire.fired = True
                _break_connection(wire.conn)  # its wait wakes up and fails at once
            elif soonest is None or deadline < soonest:
                soonest = deadline
        if soonest is not None:
            self._timer = loop.call_at(soonest, self._fire, loop)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._busy.clear()


__all__ = ["Query", "Watchdog", "Wire", "query_of"]
