"""The Redis stores' client side: importing redis-py, building its clients (sync and
``redis.asyncio``, standalone and Cluster) with bounded timeouts and no automatic retries, the
scripts' text and digests, the options check, and the translation of driver errors (also used
by :mod:`idempotent_tasks.caches.redis`)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from ..._core.errors import ConfigurationError, IdempotencyError, StoreUnavailableError
from ..._core.records import Scope

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

    Client: TypeAlias = redis.Redis | redis.cluster.RedisCluster
    AsyncClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

DEFAULT_PREFIX: Final = "idem"
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_SOCKET_TIMEOUT: Final = 5.0
#: Garbage-collection margin added to every Redis TTL; must exceed the handler's ``ttl``.
DEFAULT_GC_TTL: Final = 7 * 86400.0
CLUSTER_SCHEME: Final = "redis+cluster://"
INSTALL_HINT: Final = "the redis extra is not installed: pip install 'idempotent-tasks[redis]'"
#: The package whose ``lua/`` folder holds the scripts.
_SCRIPTS_PACKAGE: Final = "idempotent_tasks.stores.redis"
#: Every script the stores run (``lua/<name>.lua``), in the order ``create_schema`` loads them.
SCRIPTS: Final = (
    "claim",
    "claim_many",
    "take_over",
    "reopen",
    "heartbeat",
    "mark_success",
    "mark_success_many",
    "mark_failed",
    "record_failure",
    "release",
    "save_steps",
    "mark_uncertain",
    "resolve_uncertain",
    "delete_record",
    "reset_retry_count",
    "purge_shard",
    "prune_processing",
    "acquire_lock",
    "release_lock",
)


def import_redis() -> ModuleType:
    """redis-py, imported on first use so that the core never needs it."""
    try:
        import redis
        import redis.cluster
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(INSTALL_HINT) from exc
    return redis


@cache
def driver_errors() -> tuple[type[BaseException], ...]:
    """Every exception redis-py raises for a server that is down, slow or refusing: all of
    them are translated to :class:`StoreUnavailableError` at the store boundary."""
    import_redis()
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException)


@cache
def script_text(name: str) -> bytes:
    """The source of ``lua/<name>.lua`` (package data: works from a wheel or a zip)."""
    return resources.files(_SCRIPTS_PACKAGE).joinpath("lua", f"{name}.lua").read_bytes()


@cache
def script_sha(name: str) -> str:
    """The SHA-1 ``EVALSHA`` names ``lua/<name>.lua`` by, computed here (nothing is sent)."""
    return hashlib.sha1(script_text(name), usedforsecurity=False).hexdigest()


def check_options(
    prefix: str,
    connect_timeout: float,
    socket_timeout: float,
    gc_ttl: float,
    wait_replicas: int = 0,
    wait_timeout: float = 0.0,
) -> None:
    """Every store option, checked before anything is built; ``wait_timeout`` must be
    shorter than the socket timeout (else the socket would give up on the WAIT first)."""
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError("prefix must be non-empty and free of '{' and '}' (hash tags)")
    if gc_ttl <= 0:
        raise ConfigurationError("gc_ttl must be positive (and exceed the handler's ttl)")
    if connect_timeout <= 0 or socket_timeout <= 0:
        raise ConfigurationError("connect_timeout and socket_timeout must be > 0")
    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
        raise ConfigurationError("wait_replicas must be a whole number >= 0")
    if wait_replicas and (not wait_timeout > 0 or wait_timeout >= socket_timeout):
        raise ConfigurationError(
            "wait_timeout must be > 0 and shorter than socket_timeout (the WAIT must end "
            "before the socket gives up on it)"
        )


def build_client(url: str, *, connect_timeout: float, socket_timeout: float) -> Client:
    """A client for ``url`` with bounded timeouts and no automatic retries (a retried
    write could report a stale outcome; the handler has its own bounded retry)."""
    redis = import_redis()
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        "decode_responses": False,
    }
    if url.startswith(CLUSTER_SCHEME):
        cluster: Client = redis.cluster.RedisCluster.from_url(
            "redis://" + url[len(CLUSTER_SCHEME) :], **options
        )
        return cluster
    standalone: Client = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)
    return _bound_handshake(standalone, _SyncHandshake)


def command(client: Any, *args: Any) -> Any:
    """``execute_command`` (untyped in redis-py) behind one typed door; ``client`` is a
    client or a pipeline."""
    return client.execute_command(*args)


def build_async_client(
    url: str, *, connect_timeout: float, socket_timeout: float, max_connections: int
) -> AsyncClient:
    """A ``redis.asyncio`` client for ``url`` (``redis+cluster://``: a ``RedisCluster``, which
    connects on its first command, not here) with bounded timeouts and no automatic retries."""
    import_redis()
    import redis.asyncio
    import redis.asyncio.cluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": socket_timeout,
        "decode_responses": False,
    }
    if url.startswith(CLUSTER_SCHEME):
        cluster: AsyncClient = redis.asyncio.cluster.RedisCluster.from_url(
            "redis://" + url[len(CLUSTER_SCHEME) :], max_connections=max_connections, **options
        )
        return cluster
    standalone: AsyncClient = redis.asyncio.Redis.from_url(
        url, retry=Retry(NoBackoff(), 0), max_connections=max_connections, **options
    )
    return _bound_handshake(standalone, _AsyncHandshake)


class _SyncHandshake:
    """The handshake (``HELLO``, ``AUTH``, ``SELECT``, ``CLIENT SETINFO``) under the connect
    timeout: redis-py reads its replies with the socket timeout, so a server that accepts and
    never answers would hold the first call for ``socket_timeout`` instead."""

    _sock: Any
    socket_timeout: float | None
    socket_connect_timeout: float | None

    def on_connect_check_health(self, check_health: bool = True) -> None:
        self._sock.settimeout(self.socket_connect_timeout)
        try:
            super().on_connect_check_health(check_health)  # type: ignore[misc]
        finally:
            if self._sock is not None:  # None: the failed handshake disconnected it
                self._sock.settimeout(self.socket_timeout)


class _AsyncHandshake:
    """:class:`_SyncHandshake` for ``redis.asyncio`` (its reads take ``socket_timeout``)."""

    socket_timeout: float | None
    socket_connect_timeout: float | None

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        read, self.socket_timeout = self.socket_timeout, self.socket_connect_timeout
        try:
            await super().on_connect_check_health(check_health)  # type: ignore[misc]
        finally:
            self.socket_timeout = read


_C = TypeVar("_C")
_Handshake: TypeAlias = type[_SyncHandshake] | type[_AsyncHandshake]
_BOUNDED: dict[tuple[type[Any], _Handshake], type[Any]] = {}


def _bound_handshake(client: _C, handshake: _Handshake) -> _C:
    """``client`` (standalone) with its pool's connection class — TCP, TLS or Unix socket, as
    the URL chose — doing its handshake under the connect timeout."""
    pool: Any = getattr(client, "connection_pool")  # noqa: B009 - absent from the union type
    pool.connection_class = _bounded(pool.connection_class, handshake)
    return client


def _bounded(connection_class: type[Any], handshake: _Handshake) -> type[Any]:
    if issubclass(connection_class, handshake):
        return connection_class
    key = (connection_class, handshake)
    if key not in _BOUNDED:  # one subclass per class: the pools of many stores share it
        name = f"HandshakeBounded{connection_class.__name__}"
        _BOUNDED[key] = type(name, (handshake, connection_class), {})
    return _BOUNDED[key]


def unavailable(call: str, exc: BaseException, scope: Scope | None = None) -> IdempotencyError:
    """The store error for a driver error: an authentication failure (a wrong password or
    user, ``NOAUTH``) is a :class:`ConfigurationError` — retrying would never help; anything
    else is an outage, :class:`StoreUnavailableError`."""
    from redis.exceptions import AuthenticationError, AuthenticationWrongNumberOfArgsError

    kind: type[IdempotencyError] = StoreUnavailableError
    if isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError):
        kind = ConfigurationError
    return kind(
        f"redis store: {call} failed: {type(exc).__name__}: {exc}",
        tenant=scope.tenant if scope else None,
        operation=scope.operation if scope else None,
        key=scope.key if scope else None,
    )


def glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
