"""A loopback TCP proxy for fault tests: slow links and dropped connections on command.

``TCPProxy(target_port).start()`` listens on ``127.0.0.1:<proxy.port>`` and forwards every
connection to the target (PostgreSQL, Redis, …) from an asyncio event loop running in its own
daemon thread.  The test thread steers it with plain method calls, each of which returns only
once the loop has applied it:

* ``set_latency(s)`` delays every chunk, in both directions, by ``s`` seconds (a huge value
  is a server that stops answering);
* ``drop()`` aborts every open connection (both sides, RST) and refuses new ones — accepted
  and aborted at once — until ``forward()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

_T = TypeVar("_T")
_CHUNK = 65536


class TCPProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.latency = 0.0
        self.accepted = 0
        self._down = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- control (called from the test thread) ------------------------------------------------
    def start(self) -> TCPProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set_latency(self, seconds: float) -> None:
        self._call(self._set("latency", seconds))

    def drop(self) -> None:
        """Abort every open connection and refuse new ones until :meth:`forward`."""
        self._call(self._drop())

    def forward(self) -> None:
        self._call(self._set("_down", False))

    @property
    def open_connections(self) -> int:
        return self._call(self._count())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> TCPProxy:
        return self.start()

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- the event loop side -----------------------------------------------------------------
    async def _set(self, name: str, value: Any) -> None:
        setattr(self, name, value)

    async def _count(self) -> int:
        return len(self._transports) // 2

    async def _drop(self) -> None:
        self._down = True
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        for task in list(self._tasks):  # also those sleeping on a huge latency
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _shutdown(self) -> None:
        await self._drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._down:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        except asyncio.CancelledError:
            pass  # dropped on command
        finally:
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, up_writer.transport)
        self._transports.update(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for transport in pair:
                self._transports.discard(transport)
                transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; any end (EOF, reset, drop) closes the whole connection."""
        with contextlib.suppress(OSError):
            while data := await reader.read(_CHUNK):
                if self.latency:
                    await asyncio.sleep(self.latency)
                if writer.transport.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
