"""The Redis stores' transports: what carries a plan's commands (``_scripts``) to Redis.

Both run a plan to its end and translate every driver error into ``StoreUnavailableError``
at this boundary; both use redis-py's documented client API only.

* :class:`SyncTransport` (``RedisStore``): a ``redis.Redis``, ``redis.cluster.RedisCluster``
  or Sentinel-managed client.  A standalone client with a plain connection pool gets one
  held connection per thread for single commands and pipelines (``_direct``: the client
  pool's own connection class and settings, driven through ``send_command`` /
  ``read_response``); any other client is used as it is (``execute_command``,
  ``pipeline``).
* :class:`AsyncTransport` (``AsyncRedisStore``): a ``redis.asyncio.Redis``,
  ``redis.asyncio.cluster.RedisCluster`` or a Sentinel-managed ``redis.asyncio`` client.  A
  standalone client with a plain connection pool lends the store's held connections of its
  event loop to single commands and pipelines (``_async_direct``: the client pool's own
  connection class and settings, driven through ``send_packed_command`` /
  ``read_response``); any other client is used as it is (``execute_command``,
  ``pipeline``).  At most ``max_connections`` steps are in flight at once (more wait their
  turn).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..._core.errors import ConfigurationError
from ..._core.records import Scope
from ._async_direct import loop_connections
from ._client import (
    CLUSTER_SCHEME,
    build_async_client,
    build_client,
    command,
    driver_errors,
    import_redis,
    unavailable,
)
from ._direct import thread_connections
from ._scripts import Command, Plan, Scan, Step

if TYPE_CHECKING:
    from ._client import AsyncClient, Client

T = TypeVar("T")


class SyncTransport:
    """Runs plans on a redis-py client, blocking (see the module docstring)."""

    def __init__(
        self, url_or_client: str | Client, *, connect_timeout: float, socket_timeout: float
    ) -> None:
        redis = import_redis()
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._timeouts = (connect_timeout, socket_timeout)
        # redis+cluster:// is built on first use: RedisCluster connects in its constructor.
        self._client: Client | None = None
        self._connect_lock = threading.Lock()
        if self._url is None:
            self._client = url_or_client  # type: ignore[assignment]
        elif not self._url.startswith(CLUSTER_SCHEME):
            self._client = build_client(
                self._url, connect_timeout=connect_timeout, socket_timeout=socket_timeout
            )
        self.cluster = isinstance(self._client, redis.cluster.RedisCluster) or (
            self._url is not None and self._url.startswith(CLUSTER_SCHEME)
        )
        self.direct = None if self.cluster else thread_connections(self._client)
        self._one: Callable[..., Any] = (
            self.direct.execute if self.direct is not None else self._command
        )
        self.errors = driver_errors()
        self.noscript: type[Exception] = redis.exceptions.NoScriptError

    def client(self) -> Client:
        client = self._client
        if client is None:
            with self._connect_lock:  # RedisCluster connects while it is being built
                client = self._client
                if client is None:
                    assert self._url is not None
                    connect, read = self._timeouts
                    client = self._client = build_client(
                        self._url, connect_timeout=connect, socket_timeout=read
                    )
        return client

    def run(self, plan: Plan[T], scope: Scope | None = None) -> T:
        """``plan`` to its end: each step sent, its reply (or the error in its place) sent
        back into the plan; one command at a time is sent inline (the hot path)."""
        one, errors = self._one, self.errors
        try:
            step = next(plan)
            while True:
                try:
                    reply = one(*step) if type(step) is tuple else self._many(step)
                except errors as exc:
                    reply = exc  # refused by the server, or not carried out: the plan decides
                step = plan.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        except errors as exc:
            raise _unavailable(plan, exc, scope) from exc

    def _command(self, *args: Any) -> Any:
        return command(self.client(), *args)

    def _many(self, step: Step) -> Any:
        """A pipeline (in one write on the held connection) or a key scan."""
        if isinstance(step, Scan):
            return list(self.client().scan_iter(match=step.pattern, count=1000))
        assert isinstance(step, list)
        if self.direct is not None:
            return self.direct.execute_many(step)
        pipe = self.client().pipeline(transaction=False)
        for cmd in step:
            command(pipe, *cmd)
        return list(pipe.execute(raise_on_error=False))

    def close(self, *, owned: bool) -> None:
        """Disconnect the held connections (always ours), and close the client if ``owned``
        (a cluster client built from a URL is built again on next use)."""
        if self.direct is not None:
            self.direct.close()
        client = self._client
        if not owned or client is None:
            return
        client.close()
        if self._url is not None and self._url.startswith(CLUSTER_SCHEME):
            self._client = None


class AsyncTransport:
    """Runs plans on a ``redis.asyncio`` client, awaiting each step on the running loop."""

    def __init__(
        self,
        url_or_client: str | AsyncClient,
        *,
        connect_timeout: float,
        socket_timeout: float,
        max_connections: int,
    ) -> None:
        import_redis()
        import redis.asyncio
        import redis.asyncio.cluster
        import redis.exceptions

        if isinstance(url_or_client, str):
            self.client: AsyncClient = build_async_client(
                url_or_client, connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                max_connections=max_connections,
            )
        elif isinstance(url_or_client, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster):
            self.client = url_or_client
        else:
            raise ConfigurationError(
                "AsyncRedisStore takes a redis:// URL or a redis.asyncio client (Redis, "
                f"RedisCluster, a Sentinel's master_for()), not {type(url_or_client).__name__}"
            )
        self.cluster = isinstance(self.client, redis.asyncio.cluster.RedisCluster)
        self.held = loop_connections(self.client)
        self.errors: tuple[type[BaseException], ...] = (*driver_errors(), OSError)
        self.noscript: type[Exception] = redis.exceptions.NoScriptError
        #: Steps in flight at once; an uncontended acquire costs no task switch.
        self._slots = asyncio.Semaphore(max_connections)

    async def run(self, plan: Plan[T], scope: Scope | None = None) -> T:
        """``plan`` to its end, step by step: each step awaited, its reply (or the error in
        its place) sent back into the plan."""
        reply: Any = None  # what starts a generator
        while True:
            try:
                step = plan.send(reply)
            except StopIteration as done:
                result: T = done.value
                return result
            except self.errors as exc:
                raise _unavailable(plan, exc, scope) from exc
            reply = await self._send(step)

    async def _send(self, step: Step) -> Any:
        """One step's reply, or the error in its place (at most ``max_connections`` steps
        are in flight at once)."""
        client, held = self.client, self.held
        try:
            async with self._slots:
                if isinstance(step, tuple):
                    if held is not None:
                        return (await held.exchange((step,)))[0]
                    return await command(client, *step)
                if isinstance(step, Scan):
                    return [key async for key in client.scan_iter(match=step.pattern, count=1000)]
                if held is not None:
                    return await held.exchange(step)
                return await self._pipeline(step)
        except self.errors as exc:
            return exc  # refused by the server, or not carried out: the plan decides

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            command(pipe, *cmd)
        return list(await pipe.execute(raise_on_error=False))

    async def close(self, *, owned: bool) -> None:
        """Disconnect the held connections (always ours), and close the client if
        ``owned``."""
        if self.held is not None:
            await self.held.close()
        if owned:
            await self.client.aclose()


def _unavailable(plan: Plan[Any], exc: BaseException, scope: Scope | None) -> Exception:
    """The store error for a driver error, named after the plan (a generator is named after
    its function: the protocol names each like the store method it serves)."""
    return unavailable(getattr(plan, "__name__", "call"), exc, scope)
