"""RedisStore: the Redis protocol (``_protocol``) on the blocking transport (``_transport``);
see the package docstring for what it guarantees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..._core.records import CreateResult, Scope, Status, StoredRecord
from .._feed import scope_digest
from ..base import ClaimRequest, FailureResult, SuccessWrite, TakeOver
from ..effects import Resolution
from ._client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GC_TTL,
    DEFAULT_PREFIX,
    DEFAULT_SOCKET_TIMEOUT,
    check_options,
)
from ._protocol import CLAIM_CHUNK, RedisProtocol
from ._pubsub import ChangeFeed, announce_change, feed_channel
from ._records import Keys
from ._replication import DEFAULT_WAIT_TIMEOUT
from ._transport import SyncTransport

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["CLAIM_CHUNK", "RedisStore", "RedisStoreBase"]


class RedisStoreBase:
    """What both Redis stores are besides their methods: the options, the protocol (one
    copy, see ``_protocol``) and who owns the client."""

    name = "redis"

    def __init__(
        self,
        url_or_client: object,
        transport: Any,
        *,
        prefix: str,
        gc_ttl: float,
        wait_replicas: int,
        wait_timeout: float,
    ) -> None:
        self.prefix = prefix
        self.wait_replicas = wait_replicas
        self._owned = isinstance(url_or_client, str)  # a client passed in is the caller's
        self._protocol = RedisProtocol.on(
            transport, prefix, gc_ttl=gc_ttl, wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )

    def _keys(self, scope: Scope) -> Keys:
        return self._protocol.keys(scope)


class RedisStore(RedisStoreBase):
    """The store contract on Redis, Redis Cluster or a Sentinel-managed primary (see the
    package docstring).  Never connects in its constructor."""

    def __init__(
        self,
        url_or_client: str | Client,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        gc_ttl: float = DEFAULT_GC_TTL,
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        check_options(
            prefix, connect_timeout, socket_timeout, gc_ttl, wait_replicas, wait_timeout
        )
        self._transport = transport = SyncTransport(
            url_or_client, connect_timeout=connect_timeout, socket_timeout=socket_timeout
        )
        super().__init__(
            url_or_client, transport, prefix=prefix, gc_ttl=gc_ttl,
            wait_replicas=wait_replicas, wait_timeout=wait_timeout,
        )
        self._run = transport.run
        self._feed = ChangeFeed(
            transport.client, feed_channel(prefix), (*transport.errors, OSError)
        )

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r})"

    # -- claims -------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        return self._run(self._protocol.create(scope, request_hash, now, lease_expires_at), scope)

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        return self._run(self._protocol.create_many(claims, now, lease_expires_at))

    def get(self, scope: Scope) -> StoredRecord | None:
        return self._run(self._protocol.get(scope), scope)

    # -- conditional writes -------------------------------------------------------------
    def take_over(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> TakeOver | None:
        plan = self._protocol.take_over(scope, expected_token, now, lease_expires_at)
        return self._run(plan, scope)

    def reopen(
        self, scope: Scope, *, expected_token: int, now: float, lease_expires_at: float
    ) -> int | None:
        """A settled record of ``expected_token`` to a new attempt (``stores.reopen``)."""
        return self._run(self._protocol.reopen(scope, expected_token, now, lease_expires_at), scope)

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        return self._run(self._protocol.heartbeat(scope, token, now, lease_expires_at), scope)

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        plan = self._protocol.mark_success(scope, token, response, now, expires_at)
        return self._run(plan, scope)

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        return self._run(self._protocol.mark_success_many(writes, now))

    def mark_failed(
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
        return self._run(plan, scope)

    def release(self, scope: Scope, *, token: int) -> bool:
        return self._run(self._protocol.release(scope, token), scope)

    def record_failure(
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
        return self._run(plan, scope)

    # -- steps and the UNCERTAIN status (stores.effects) --------------------------------
    def save_steps(self, scope: Scope, *, token: int, steps: bytes, now: float) -> bool:
        return self._run(self._protocol.save_steps(scope, token, steps, now), scope)

    def load_steps(self, scope: Scope) -> bytes | None:
        return self._run(self._protocol.load_steps(scope), scope)

    def mark_uncertain(
        self, scope: Scope, *, token: int, now: float, detail: bytes | None
    ) -> bool:
        return self._run(self._protocol.mark_uncertain(scope, token, now, detail), scope)

    def resolve_uncertain(
        self,
        scope: Scope,
        *,
        resolution: Resolution,
        now: float,
        response: bytes | None = None,
        expires_at: float | None = None,
    ) -> bool:
        plan = self._protocol.resolve_uncertain(scope, resolution, now, response, expires_at)
        return self._run(plan, scope)

    # -- the change feed (stores.changes) -----------------------------------------------
    def announce_change(self, scope: Scope) -> None:
        """One ``PUBLISH`` of the scope's digest on the store's channel (``_pubsub``)."""
        self._run(announce_change(self._feed.channel, scope_digest(scope)), scope)

    def wait_for_change(self, scope: Scope, *, timeout: float) -> bool:
        """Block until ``scope`` is announced (True) or ``timeout`` seconds pass (False); the
        store's one subscription in this process wakes every waiter (``_pubsub``)."""
        return self._feed.wait(scope_digest(scope), timeout)

    # -- counters and operator actions --------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        return self._run(self._protocol.get_retry_count(scope), scope)

    def reset_retry_count(self, scope: Scope) -> None:
        self._run(self._protocol.reset_retry_count(scope), scope)

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        return self._run(self._protocol.delete_record(scope, status), scope)

    # -- maintenance --------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        return self._run(self._protocol.find_stuck(now, heartbeat_before, limit))

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        return self._run(self._protocol.delete_expired(now, counters_before, limit))

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        plan = self._protocol.list_records(status, operation, tenant, limit, offset)
        return self._run(plan)

    def stats(self) -> Mapping[tuple[str, Status], int]:
        return self._run(self._protocol.stats())

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        return self._run(self._protocol.acquire_lock(name, owner, now, ttl))

    def release_lock(self, name: str, *, owner: str) -> None:
        self._run(self._protocol.release_lock(name, owner))

    # -- lifecycle ------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Nothing to create (each shard's token counter is made by its first claim); loads
        the scripts (on every primary in Cluster), which also proves the server is
        reachable.  Idempotent."""
        self._run(self._protocol.create_schema())

    def drop_schema(self) -> None:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        self._run(self._protocol.drop_schema())

    def close(self) -> None:
        """Close the connection pool if this store built the client (a client passed in
        belongs to the caller), and the hot path's per-thread connections and the change
        feed's subscription (always ours; a later call opens them again)."""
        self._feed.close()
        self._transport.close(owned=self._owned)
