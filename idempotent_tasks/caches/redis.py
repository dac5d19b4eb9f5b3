"""Redis cache: a shared fast path for replays of SUCCESS records.

The store stays the source of truth; this cache only saves a store round trip when many
workers replay the same results.  Its failures are swallowed by the handler, so every call
here is bounded in time instead: short connect and socket timeouts (defaults 0.5 s and
0.25 s) and no automatic retries, so a dead or stalled cache costs one short timeout, never
a long stall.  Entries expire by Redis's own ``PX`` TTL (a cache may forget early; that only
costs a store read).  Needs ``pip install 'idempotent-tasks[redis]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..stores.redis import CLUSTER_SCHEME, build_client, command

if TYPE_CHECKING:
    from ..stores.redis import Client

DEFAULT_PREFIX: Final = "idem-cache"
DEFAULT_SOCKET_TIMEOUT: Final = 0.25
DEFAULT_CONNECT_TIMEOUT: Final = 0.5


class RedisCache:
    """``GET`` / ``SET PX`` / ``DEL`` under ``<prefix>:<key>``; never connects on construction."""

    name = "redis"

    def __init__(
        self,
        url_or_client: str | Client,
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._timeouts = (connect_timeout, socket_timeout)
        # A cluster client connects in its constructor, so it is built on first use.
        self._client: Client | None = None
        if self._url is None:
            self._client = url_or_client  # type: ignore[assignment]
        elif not self._url.startswith(CLUSTER_SCHEME):
            self._client = self._conn()
        self._prefix = prefix + ":"

    def _conn(self) -> Client:
        client = self._client
        if client is None:
            assert self._url is not None
            connect, read = self._timeouts
            client = self._client = build_client(
                self._url, connect_timeout=connect, socket_timeout=read
            )
        return client

    def get(self, key: str) -> bytes | None:
        value = command(self._conn(), "GET", self._prefix + key)
        return value if value is None else bytes(value)

    def set(self, key: str, value: bytes, ttl: float) -> None:
        """Store ``value`` for ``ttl`` seconds (at least 1 ms); ``ttl <= 0`` stores nothing
        and drops any older entry."""
        if ttl <= 0:
            self.delete(key)
            return
        px = max(1, int(ttl * 1000))
        command(self._conn(), "SET", self._prefix + key, value, "PX", px)

    def delete(self, key: str) -> None:
        command(self._conn(), "DEL", self._prefix + key)

    def close(self) -> None:
        """Close the connection pool if this cache built the client."""
        if self._url is not None and self._client is not None:
            self._client.close()
            if self._url.startswith(CLUSTER_SCHEME):
                self._client = None
