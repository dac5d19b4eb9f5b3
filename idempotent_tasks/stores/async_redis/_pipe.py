"""AsyncRedisStore's hot path: one pipelined connection, replies matched to commands in order.

Redis answers the commands of one connection in the order it received them, so any number of
coroutines can have a command in flight on one socket: each command is packed straight to
RESP bytes and queued with a future, the commands queued while the loop is busy go out in one
``write`` on its next turn, and the replies — parsed by ``hiredis`` — resolve the futures in
order.  Against one command per connection through ``redis.asyncio`` (a checkout, a packer
with encoders, a read under ``asyncio.timeout`` on a stream) this costs a small fraction of
the CPU per command and one system call per batch of commands instead of two per command; it
is what the store runs its scripts on when it built the client from a ``redis://`` or
``unix://`` URL and ``hiredis`` is installed (``_held.py`` otherwise).

* Deadline: a reply later than ``socket_timeout`` after its command was queued means the link
  went silent.  One timer per connection (not one per command) watches the oldest command;
  when it fires, the connection is aborted and every command in flight fails with
  ``redis.exceptions.TimeoutError`` (the store fails closed; nothing is retried, since a
  command may have run).  A lost connection fails its commands with ``ConnectionError``; the
  next command opens a new one.
* A server error reply (``NOSCRIPT``, ``READONLY``, …) fails that command alone, as the
  exception ``redis-py`` would raise for it; the connection stays usable.
* A command whose caller is cancelled still runs (it may already be on the wire, exactly as
  with ``redis-py``); its reply is read and dropped.
* The handshake — ``AUTH``, ``CLIENT SETNAME``, ``SELECT`` — is sent from the URL's own
  fields; a URL with any other option (TLS, RESP3, a credential provider, …) is served by
  ``redis.asyncio``'s connections instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

#: URL fields the pipe's own handshake understands; anything else: redis-py's connections.
_HANDSHAKE_KEYS: Final = frozenset({
    "host", "port", "path", "db", "username", "password", "client_name",
    "socket_timeout", "socket_connect_timeout", "decode_responses", "max_connections",
    "retry", "protocol", "connection_class",
})


def _encode(value: Any) -> bytes:
    """An argument as redis-py's ``Encoder`` encodes it (no ``bool``: it refuses those too)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value).encode()
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    from redis.exceptions import DataError

    raise DataError(f"invalid input of type {type(value).__name__!r} for a Redis command")


def pack(args: Sequence[Any]) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)  # the common types inline (exact types: a bool is refused below)
        if kind is bytes:
            data = arg
        elif kind is str:
            data = arg.encode()
        elif kind is int or kind is float:
            data = repr(arg).encode()
        else:
            data = _encode(arg)
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


class PipedConnection(asyncio.Protocol):
    """One Redis connection carrying the commands of every coroutine of its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, where: str) -> None:
        import hiredis
        from redis._parsers.base import BaseParser
        from redis.exceptions import InvalidResponse

        self.loop = loop
        self._timeout = timeout
        self._where = where
        self._reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error
        )
        #: Commands sent or about to be, oldest first: (future, deadline).
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        self._flush_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self.broken: BaseException | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self._waiting
        reader.feed(data)
        try:
            while waiting:
                reply = reader.gets()
                if reply is False:
                    return
                future = waiting.popleft()[0]
                if future.done():
                    continue  # its caller was cancelled: the reply is dropped
                if isinstance(reply, Exception):  # an error reply, as redis-py's exception
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except Exception as exc:  # a protocol error: nothing on this connection can be trusted
            self._break(exc)
            return
        if reader.gets() is not False:  # a reply nobody asked for
            from redis.exceptions import InvalidResponse

            self._break(InvalidResponse(f"unexpected reply from {self._where}"))

    def connection_lost(self, exc: Exception | None) -> None:
        from redis.exceptions import ConnectionError

        self._break(ConnectionError(f"connection to {self._where} lost"), abort=False)

    # -- commands ---------------------------------------------------------------------------
    def execute(self, args: Sequence[Any]) -> asyncio.Future[Any]:
        """Queue one command; its reply (or error) resolves the future returned."""
        if self.broken is not None:
            raise _fresh(self.broken)
        data = pack(args)
        future = self.loop.create_future()
        waiting = self._waiting
        idle = not waiting and not self._flush_pending
        waiting.append((future, self.loop.time() + self._timeout))
        if self._timer is None:
            self._timer = self.loop.call_at(waiting[0][1], self._check_deadline)
        if idle and self._transport is not None:
            self._transport.write(data)  # nothing else in flight: no reason to wait
        else:  # others in flight: this one goes out with the batch on the loop's next turn
            self._out.append(data)
            if not self._flush_pending:
                self._flush_pending = True
                self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_pending = False
        out, self._out = self._out, []
        transport = self._transport
        if out and transport is not None and self.broken is None:
            transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _check_deadline(self) -> None:
        self._timer = None
        waiting = self._waiting
        if not waiting or self.broken is not None:
            return
        oldest = waiting[0][1]
        if oldest <= self.loop.time():
            from redis.exceptions import TimeoutError

            self._break(TimeoutError(f"no reply from {self._where} within {self._timeout} s"))
            return
        self._timer = self.loop.call_at(oldest, self._check_deadline)

    def _break(self, exc: BaseException, *, abort: bool = True) -> None:
        """Unusable from now on: close it, fail every command in flight."""
        if self.broken is None:
            self.broken = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport, self._transport = self._transport, None
        if abort and transport is not None:
            transport.abort()
        waiting, self._waiting = self._waiting, deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(_fresh(self.broken))

    def close(self) -> None:
        from redis.exceptions import ConnectionError

        self._break(ConnectionError("the store was closed"))


class Pipe:
    """The store's pipelined connection: opened on first use, replaced once lost.  ``on_lost``
    runs before a lost connection is replaced (the store disconnects its client's idle
    connections then: they died with it)."""

    def __init__(
        self,
        options: Mapping[str, Any],
        connect_timeout: float,
        timeout: float,
        on_lost: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self._on_lost = on_lost
        self._options = dict(options)
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._conn: PipedConnection | None = None
        self._opening: asyncio.Task[PipedConnection] | None = None
        path = self._options.get("path")
        self._where = path or f"{self._options.get('host')}:{self._options.get('port', 6379)}"

    async def execute(self, *args: Any) -> Any:
        conn = self._conn
        if conn is None or conn.broken is not None or conn.loop is not _running_loop():
            conn = await self._connection()
        return await conn.execute(args)

    async def _connection(self) -> PipedConnection:
        lost, on_lost = self._conn, self._on_lost
        if lost is not None and lost.broken is not None:
            self._conn = None
            if on_lost is not None and lost.loop is _running_loop():
                with contextlib.suppress(Exception):
                    await on_lost()
        opening = self._opening
        if opening is None or opening.get_loop() is not _running_loop():
            self._conn = None
            opening = self._opening = asyncio.ensure_future(self._open())
        try:
            conn = await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None
        return conn

    async def _open(self) -> PipedConnection:
        """Connect and send the handshake, within ``connect_timeout``; an OS error (refused,
        unreachable, the timeout) becomes redis-py's ``ConnectionError`` / ``TimeoutError``."""
        from redis import exceptions

        loop = asyncio.get_running_loop()
        conn = PipedConnection(loop, self._timeout, self._where)
        o = self._options
        try:
            async with asyncio.timeout(self._connect_timeout):
                if o.get("path"):
                    await loop.create_unix_connection(lambda: conn, o["path"])
                else:
                    await loop.create_connection(
                        lambda: conn, o.get("host", "localhost"), int(o.get("port", 6379))
                    )
                await self._handshake(conn)
        except OSError as exc:  # TimeoutError is one
            conn.close()
            timed_out = isinstance(exc, TimeoutError)
            kind = exceptions.TimeoutError if timed_out else exceptions.ConnectionError
            raise kind(f"cannot connect to {self._where}: {exc!r}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    async def _handshake(self, conn: PipedConnection) -> None:
        o = self._options
        steps: list[tuple[Any, ...]] = []
        if o.get("password") is not None:
            user = o.get("username")
            steps.append(("AUTH", user, o["password"]) if user else ("AUTH", o["password"]))
        if o.get("client_name"):
            steps.append(("CLIENT", "SETNAME", o["client_name"]))
        if int(o.get("db") or 0):
            steps.append(("SELECT", int(o["db"])))
        for reply in await asyncio.gather(*(conn.execute(s) for s in steps)):
            if reply not in (b"OK", "OK", True):
                from redis.exceptions import ConnectionError

                raise ConnectionError(f"handshake with {self._where} refused: {reply!r}")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            with contextlib.suppress(RuntimeError):  # its loop is gone already
                opening.cancel()


def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _fresh(exc: BaseException) -> BaseException:
    """A new instance of the error that broke a connection, for each command it fails (one
    shared instance would collect every awaiting task's traceback)."""
    try:
        return type(exc)(*exc.args)
    except Exception:
        return exc


def pipe_for(
    url: str,
    *,
    connect_timeout: float,
    socket_timeout: float,
    on_lost: Callable[[], Awaitable[Any]] | None = None,
) -> Pipe | None:
    """The pipelined connection for a plain ``redis://`` / ``unix://`` URL when ``hiredis``
    is installed; ``None`` (``redis.asyncio``'s connections) for anything else."""
    try:
        import hiredis  # noqa: F401
        import redis.asyncio
        from redis.asyncio.connection import parse_url
    except ImportError:
        return None
    try:
        options = parse_url(url)
    except (ValueError, TypeError):
        return None
    cls = options.get("connection_class")
    if cls is not None and cls not in (
        redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection
    ):
        return None  # TLS and other connection classes: redis-py's own connections
    if not set(options) <= _HANDSHAKE_KEYS or options.get("protocol") not in (None, 2, "2"):
        return None
    return Pipe(options, connect_timeout, socket_timeout, on_lost)


__all__ = ["Pipe", "PipedConnection", "pack", "pipe_for"]
