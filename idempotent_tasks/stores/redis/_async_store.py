"""AsyncRedisStore: the Redis protocol (``_protocol``) on the awaiting transport
(``_transport``); see :mod:`idempotent_tasks.stores.async_redis` for what it guarantees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from ..._core.errors import ConfigurationError
from ..._core.records import CreateResult, Scope, Status, StoredRecord
from .._feed import scope_digest
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..effects import Resolution
from ._async_pubsub import AsyncChangeFeed
from ._client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GC_TTL,
    DEFAULT_PREFIX,
    DEFAULT_SOCKET_TIMEOUT,
    check_options,
)
from ._protocol import CLAIM_CHUNK
from ._pubsub import announce_change, feed_channel
from ._replication import DEFAULT_WAIT_TIMEOUT
from ._store import RedisStoreBase
from ._transport import AsyncTransport

if TYPE_CHECKING:
    from ._client import AsyncClient

__all__ = ["CLAIM_CHUNK", "DEFAULT_MAX_CONNECTIONS", "AsyncRedisStore"]

#: Connections of a store's own pool, and steps in flight at once (more wait their turn).
DEFAULT_MAX_CONNECTIONS: Final = 50


class AsyncRedisStore(RedisStoreBase):
    """The store contract on Redis through ``redis.asyncio`` (see
    :mod:`idempotent_tasks.stores.async_redis`).  Never connects in its constructor; its
    methods are coroutines, which is what makes the handler await them on the event loop."""

    def __init__(
        self,
        url_or_client: str | AsyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        gc_ttl: float = DEFAULT_GC_TTL,
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        check_options(
            prefix, connect_timeout, socket_timeout, gc_ttl, wait_replicas, wait_timeout
        )
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or (
            max_connections < 1
        ):
            raise ConfigurationError("max_connections must be an integer >= 1")
        self._transport = transport = AsyncTransport(
            url_or_client, connect_timeout=connect_timeout, socket_timeout=socket_timeout,
            max_connections=max_connections,
        )
        super().__init__(
            url_or_client, transport, prefix=prefix, gc_ttl=gc_ttl,
            wait_replicas=wait_replicas, wait_timeout=wait_timeout,
        )
        self._run = transport.run
        self._feed = AsyncChangeFeed(
            transport.client, feed_channel(prefix), (*transport.errors, OSError)
        )

    def __repr__(self) -> str:
        return f"AsyncRedisStore({self.client!r}, prefix={self.prefix!r})"

    @property
    def client(self) -> AsyncClient:
        """The ``redis.asyncio`` client the store runs on."""
        return self._transport.client

    # -- claims -------------------------------------------------------------------------
    async def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        plan = self._protocol.create(scope, request_hash, now, lease_expires_at)
        return await self._run(plan, scope)

    async def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        return await self._run(self._protocol.create_many(claims, now, lease_expires_at))

    async def get(self, scope: Scope) -> StoredRecord | None:
        return await self._run(self._protocol.get(scope), scope)

    # -- conditional writes -------------------------------------------------------------
    async def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        plan = self._protocol.take_over(scope, expected_token, now, lease_expires_at)
        return await self._run(plan, scope)

    async def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """A settled record of ``expected_token`` to a new attempt (``stores.reopen``)."""
        plan = self._protocol.reopen(scope, expected_token, now, lease_expires_at)
        return await self._run(plan, scope)

    async def heartbeat(
        self, scope: Scope, *, token: int, now: float, lease_expires_at: float
    ) -> bool:
        plan = self._protocol.heartbeat(scope, token, now, lease_expires_at)
        return await self._run(plan, scope)

    async def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        plan = self._protocol.mark_success(scope, token, response, now, expires_at)
        return await self._run(plan, scope)

    async def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        return await self._run(self._protocol.mark_success_many(writes, now))

    async def mark_failed(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        expires_at: float,
        only_if_lease_expired: bool = False,
        response: bytes | None = None,
    ) -> bool:
        plan = self._protocol.mark_failed(
            scope, token, now, expires_at, only_if_lease_expired, response
        )
        return await self._run(plan, scope)

    async def release(self, scope: Scope, *, token: int) -> bool:
        return await self._run(self._protocol.release(scope, token), scope)

    async def record_failure(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        max_retries: int,
        expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> FailureResult | None:
        plan = self._protocol.record_failure(
            scope, token, now, max_retries, expires_at, only_if_lease_expired
        )
        return await self._run(plan, scope)

    # -- steps and the UNCERTAIN status (stores.effects) --------------------------------
    async def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        return await self._run(self._protocol.save_steps(scope, token, steps, now), scope)

    async def load_steps(self, scope: Scope) -> bytes | None:
        return await self._run(self._protocol.load_steps(scope), scope)

    async def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        return await self._run(self._protocol.mark_uncertain(scope, token, now, detail), scope)

    async def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: Resolution,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool:
        plan = self._protocol.resolve_uncertain(scope, resolution, now, response, expires_at)
        return await self._run(plan, scope)

    # -- the change feed (stores.changes) -----------------------------------------------
    async def announce_change(self, scope: Scope) -> None:
        """One ``PUBLISH`` of the scope's digest on the store's channel (``_pubsub``)."""
        await self._run(announce_change(self._feed.channel, scope_digest(scope)), scope)

    async def wait_for_change(self, scope: Scope, *, timeout: float) -> bool:
        """Wait until ``scope`` is announced (True) or ``timeout`` seconds pass (False); the
        store's one subscription per event loop wakes every waiter (``_async_pubsub``)."""
        return await self._feed.wait(scope_digest(scope), timeout)

    # -- counters and operator actions --------------------------------------------------
    async def get_retry_count(self, scope: Scope) -> int:
        return await self._run(self._protocol.get_retry_count(scope), scope)

    async def reset_retry_count(self, scope: Scope) -> None:
        await self._run(self._protocol.reset_retry_count(scope), scope)

    async def delete_record(
        self, scope: Scope, *, status: Status | None = None
    ) -> StoredRecord | None:
        return await self._run(self._protocol.delete_record(scope, status), scope)

    # -- maintenance --------------------------------------------------------------------
    async def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        return await self._run(self._protocol.find_stuck(now, heartbeat_before, limit))

    async def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        return await self._run(self._protocol.delete_expired(now, counters_before, limit))

    async def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        plan = self._protocol.list_records(status, operation, tenant, limit, offset)
        return await self._run(plan)

    async def stats(self) -> Mapping[tuple[str, Status], int]:
        return await self._run(self._protocol.stats())

    async def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        return await self._run(self._protocol.acquire_lock(name, owner, now, ttl))

    async def release_lock(self, name: str, *, owner: str) -> None:
        await self._run(self._protocol.release_lock(name, owner))

    # -- lifecycle ------------------------------------------------------------------------
    async def create_schema(self) -> None:
        """Nothing to create (each shard's token counter is made by its first claim); loads
        the scripts (on every primary in Cluster), which also proves the server is
        reachable.  Idempotent."""
        await self._run(self._protocol.create_schema())

    async def drop_schema(self) -> None:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        await self._run(self._protocol.drop_schema())

    async def close(self) -> None:
        """Close the connection pool if this store built the client (a client passed in
        belongs to the caller), and the change feed's subscriptions (always ours; a later
        wait opens one again)."""
        await self._feed.close()
        await self._transport.close(owned=self._owned)
