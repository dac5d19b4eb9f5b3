"""AsyncRedisStore's plumbing: the ``redis.asyncio`` client, running the shared Lua scripts
(EVALSHA with the NOSCRIPT reload), and the store's lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..._core.errors import ConfigurationError
from ..._core.records import Scope
from ...stores.redis._client import (
    CLUSTER_SCHEME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GC_TTL,
    DEFAULT_PREFIX,
    DEFAULT_SOCKET_TIMEOUT,
    command,
    driver_errors,
    glob_escape,
    import_redis,
    script_text,
    unavailable,
)
from ...stores.redis._plumbing import _SCRIPTS, SCAN_CHUNK, _check_options
from ...stores.redis._records import Keys, shards
from ._held import held_connections
from ._pipe import pipe_for

if TYPE_CHECKING:
    import redis.asyncio

#: Connections of a store's own pool, and commands in flight at once (more wait their turn).
DEFAULT_MAX_CONNECTIONS: Final = 50
#: The scripts' SHA-1 digests are computed here once; nothing is sent until first use.
_SHA: Final[dict[str, str]] = {}


def script_sha(name: str) -> str:
    sha = _SHA.get(name)
    if sha is None:
        import hashlib

        sha = _SHA[name] = hashlib.sha1(script_text(name), usedforsecurity=False).hexdigest()
    return sha


def build_async_client(
    url: str, *, connect_timeout: float, socket_timeout: float, max_connections: int
) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client for ``url`` with bounded timeouts and no automatic retries
    (a retried write could report a stale outcome; the handler has its own bounded retry)."""
    import_redis()
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    if url.startswith(CLUSTER_SCHEME):
        raise ConfigurationError(
            "AsyncRedisStore supports a standalone Redis server; for Redis Cluster use RedisStore"
        )
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=False, max_connections=max_connections,
    )
    return client


class AsyncRedisPlumbing:
    """Everything of AsyncRedisStore but its primitives (see the package docstring)."""

    name = "redis"
    #: The engine awaits this store's methods on the event loop (no thread hop).
    is_async = True

    def __init__(
        self,
        url_or_client: str | redis.asyncio.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        gc_ttl: float = DEFAULT_GC_TTL,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        import_redis()
        import redis.asyncio
        import redis.exceptions

        _check_options(prefix, connect_timeout, socket_timeout, gc_ttl)
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigurationError("max_connections must be an integer >= 1")
        self.prefix = prefix
        self._owned = isinstance(url_or_client, str)
        if isinstance(url_or_client, str):
            self._client = build_async_client(
                url_or_client, connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                max_connections=max_connections,
            )
        elif isinstance(url_or_client, redis.asyncio.Redis):
            self._client = url_or_client
        else:
            raise ConfigurationError(
                "AsyncRedisStore takes a redis:// URL or a redis.asyncio.Redis client, not "
                f"{type(url_or_client).__name__}"
            )
        self._errors: tuple[type[BaseException], ...] = (*driver_errors(), OSError)
        self._noscript: type[Exception] = redis.exceptions.NoScriptError
        #: Through the client (batches, scans, a client passed in): at most
        #: ``max_connections`` commands in flight; a call beyond them waits for a free slot
        #: (an uncontended acquire costs no task, unlike a blocking pool's wait).
        self._slots = asyncio.Semaphore(max_connections)
        #: The hot path, for a client we built from a URL only: one pipelined connection
        #: (``_pipe.py``) when hiredis serves a plain URL, else held connections (``_held.py``).
        self._pipe = (
            pipe_for(
                url_or_client, connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                on_lost=self._drain_client,
            )
            if isinstance(url_or_client, str) else None
        )
        self._held = (
            held_connections(self._client, max_connections)
            if self._owned and self._pipe is None else None
        )
        self._gc_ms = str(int(gc_ttl * 1000)).encode()  # encoded once, sent with every write
        self._shards = shards(prefix)

    def __repr__(self) -> str:
        return f"AsyncRedisStore({self._client!r}, prefix={self.prefix!r})"

    @property
    def client(self) -> redis.asyncio.Redis:
        return self._client

    def _keys(self, scope: Scope) -> Keys:
        return Keys(scope, self._shards)

    async def _drain_client(self) -> None:
        """Disconnect the client's idle connections (a lost one means they died too)."""
        await self._client.connection_pool.disconnect(inuse_connections=False)

    # -- running scripts ------------------------------------------------------------------
    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA of ``lua/<name>.lua``, loading it once more when the server does not know
        it (first use, restart, failover).  NOSCRIPT means nothing ran: running again is safe."""
        sha = _SHA.get(name) or script_sha(name)
        try:
            return await self._command("EVALSHA", sha, len(keys), *keys, *args)
        except self._noscript:
            await self._command("SCRIPT", "LOAD", script_text(name))
            return await self._command("EVALSHA", sha, len(keys), *keys, *args)

    async def _command(self, *args: Any) -> Any:
        """One command: on the pipelined connection or a held one (a client of our own),
        else through the client, in a connection slot."""
        pipe = self._pipe
        if pipe is not None:
            return await pipe.execute(*args)
        held = self._held
        if held is not None:
            return await held.execute(*args)
        async with self._slots:
            return await command(self._client, *args)

    async def _run(
        self, call: str, scope: Scope | None, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """One script (named like the store method ``call``), driver errors translated."""
        try:
            return await self._eval(call, keys, args)
        except self._errors as exc:
            raise unavailable(call, exc, scope) from exc

    async def _eval_many(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Several calls of one script: directly when there is one, else in one pipeline;
        calls refused with NOSCRIPT (which ran nothing) are sent again after loading."""
        if len(calls) == 1:
            return [await self._eval(name, *calls[0])]
        replies = await self._pipeline_eval(name, calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, self._noscript)]
        if missing:
            await self._client.script_load(script_text(name))
            again = await self._pipeline_eval(name, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def _pipeline_eval(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        sha = script_sha(name)
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            command(pipe, "EVALSHA", sha, len(keys), *keys, *args)
        async with self._slots:
            return list(await pipe.execute(raise_on_error=False))

    async def _pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for args in commands:
            command(pipe, *args)
        async with self._slots:
            return list(await pipe.execute())

    # -- lifecycle ------------------------------------------------------------------------
    async def create_schema(self) -> None:
        """Nothing to create (each shard's token counter is made by its first claim); loads
        the scripts, which also proves the server is reachable.  Idempotent."""
        try:
            for name in _SCRIPTS:
                await self._client.script_load(script_text(name))
        except self._errors as exc:
            raise unavailable("create_schema", exc) from exc

    async def drop_schema(self) -> None:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        pattern = glob_escape(self.prefix) + ":{*"
        try:
            keys = [k async for k in self._client.scan_iter(match=pattern, count=1000)]
            for i in range(0, len(keys), SCAN_CHUNK):
                await self._pipeline([("UNLINK", key) for key in keys[i : i + SCAN_CHUNK]])
        except self._errors as exc:
            raise unavailable("drop_schema", exc) from exc

    async def close(self) -> None:
        """Close the connection pool if this store built the client (a client passed in
        belongs to the caller)."""
        if self._pipe is not None:
            self._pipe.close()
        if self._held is not None:
            await self._held.close()
        if self._owned:
            await self._client.aclose()
