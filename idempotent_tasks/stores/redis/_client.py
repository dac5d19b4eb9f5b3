"""RedisStore's client side: importing redis-py, building clients, the scripts' text, and
the translation of driver errors (also used by :mod:`idempotent_tasks.caches.redis`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from ..._core.errors import IdempotencyError, StoreUnavailableError
from ..._core.records import Scope

if TYPE_CHECKING:
    import redis
    import redis.cluster
    from redis.commands.core import Script

    Client: TypeAlias = redis.Redis | redis.cluster.RedisCluster

DEFAULT_PREFIX: Final = "idem"
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_SOCKET_TIMEOUT: Final = 5.0
#: Garbage-collection margin added to every Redis TTL; must exceed the handler's ``ttl``.
DEFAULT_GC_TTL: Final = 7 * 86400.0
CLUSTER_SCHEME: Final = "redis+cluster://"
INSTALL_HINT: Final = "the redis extra is not installed: pip install 'idempotent-tasks[redis]'"
#: The package whose ``lua/`` folder holds the scripts.
_SCRIPTS_PACKAGE: Final = "idempotent_tasks.stores.redis"


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
    return standalone


def command(client: Any, *args: Any) -> Any:
    """``execute_command`` (untyped in redis-py) behind one typed door; ``client`` is a
    client or a pipeline."""
    return client.execute_command(*args)


def pipeline_eval(
    client: Client, script: Script, calls: Iterable[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """One ``EVALSHA`` per call in one pipeline; errors are returned in place, not raised."""
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        command(pipe, "EVALSHA", script.sha, len(keys), *keys, *args)
    return list(pipe.execute(raise_on_error=False))


def unavailable(call: str, exc: BaseException, scope: Scope | None = None) -> IdempotencyError:
    return StoreUnavailableError(
        f"redis store: {call} failed: {type(exc).__name__}: {exc}",
        tenant=scope.tenant if scope else None,
        operation=scope.operation if scope else None,
        key=scope.key if scope else None,
    )


def glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
