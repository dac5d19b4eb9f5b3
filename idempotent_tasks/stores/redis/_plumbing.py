"""RedisStore's plumbing: construction, the connection, running scripts (EVALSHA with the
NOSCRIPT reload), and the store's lifecycle."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from ..._core.errors import ConfigurationError
from ..._core.records import Scope
from ._client import (
    CLUSTER_SCHEME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GC_TTL,
    DEFAULT_PREFIX,
    DEFAULT_SOCKET_TIMEOUT,
    build_client,
    command,
    driver_errors,
    glob_escape,
    import_redis,
    pipeline_eval,
    script_text,
    unavailable,
)
from ._direct import thread_connections
from ._records import Keys, shards
from ._replication import DEFAULT_WAIT_TIMEOUT, ReplicaWaits, check_wait_options

if TYPE_CHECKING:
    from redis.commands.core import Script

    from ._client import Client

#: Records read (or keys deleted) per round trip by the operator scans.
SCAN_CHUNK: Final = 1000
_SCRIPTS: Final = (
    "claim",
    "claim_many",
    "take_over",
    "heartbeat",
    "mark_success",
    "mark_failed",
    "record_failure",
    "release",
    "delete_record",
    "reset_retry_count",
    "purge_shard",
    "prune_processing",
    "acquire_lock",
    "release_lock",
)


class RedisPlumbing:
    """Everything of RedisStore but its primitives (see the package docstring)."""

    name = "redis"

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
        redis = import_redis()
        from redis.commands.core import Script

        _check_options(prefix, connect_timeout, socket_timeout, gc_ttl)
        check_wait_options(wait_replicas, wait_timeout, socket_timeout)
        self.prefix = prefix
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._timeouts = (connect_timeout, socket_timeout)
        self._owned = self._url is not None
        # redis+cluster:// is built on first use: RedisCluster connects in its constructor.
        self._client: Client | None = None
        self._connect_lock = threading.Lock()
        if self._url is None:
            self._client = url_or_client  # type: ignore[assignment]
        elif not self._url.startswith(CLUSTER_SCHEME):
            self._client = build_client(
                self._url, connect_timeout=connect_timeout, socket_timeout=socket_timeout
            )
        self._cluster = isinstance(self._client, redis.cluster.RedisCluster) or (
            self._url is not None and self._url.startswith(CLUSTER_SCHEME)
        )
        self._direct = None if self._cluster else thread_connections(self._client)
        self._errors = driver_errors()
        self._noscript: type[Exception] = redis.exceptions.NoScriptError
        self._scripts = self._register(Script)
        self._claim = self._scripts["claim"]
        self._claim_many = self._scripts["claim_many"]
        self._mark_success = self._scripts["mark_success"]
        self._gc_ms = str(int(gc_ttl * 1000)).encode()  # encoded once, sent with every write
        self._shards = shards(prefix)
        self.wait_replicas = wait_replicas
        self._waits = self._replica_waits(wait_replicas, wait_timeout)

    def _replica_waits(self, replicas: int, timeout: float) -> ReplicaWaits | None:
        """``WAIT`` after every claim and outcome write (``_replication``); None: never."""
        if not replicas:
            return None
        if self._cluster:
            raise ConfigurationError(
                "wait_replicas is not supported on Redis Cluster (WAIT is per node); see "
                "docs/redis.md"
            )
        return ReplicaWaits(
            replicas, timeout, self._scripts, self._direct, self._noscript, self._errors
        )

    def _register(self, script_class: type[Script]) -> dict[str, Script]:
        """Every script, registered once: the SHA-1 is computed here, locally (nothing is
        sent until first use); a lazily built cluster client gets the same objects."""
        if self._client is not None:
            return {n: self._client.register_script(script_text(n)) for n in _SCRIPTS}
        return {n: script_class(None, script_text(n)) for n in _SCRIPTS}  # type: ignore[arg-type]

    def _conn(self) -> Client:
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

    def _keys(self, scope: Scope) -> Keys:
        return Keys(scope, self._shards)

    # -- running scripts ------------------------------------------------------------------
    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA, loading the script once more when the server does not know it (first
        use, restart, failover).  NOSCRIPT means nothing ran, so running again is safe."""
        waits = self._waits
        if waits is not None and waits.covers(script):
            return waits.eval(self._conn(), script, keys, args)
        direct = self._direct  # standalone: this thread's held connection
        send = direct.execute if direct is not None else partial(command, self._conn())
        try:
            return send("EVALSHA", script.sha, len(keys), *keys, *args)
        except self._noscript:
            script.sha = self._conn().script_load(script.script)
            return send("EVALSHA", script.sha, len(keys), *keys, *args)

    def _run(self, call: str, scope: Scope | None, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script (named like the store method ``call``), driver errors translated."""
        try:
            return self._eval(self._scripts[call], keys, args)
        except self._errors as exc:
            raise unavailable(call, exc, scope) from exc

    def _eval_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Several calls of one script: directly when there is one, else in one pipeline;
        calls refused with NOSCRIPT (which ran nothing) are sent again after loading."""
        if len(calls) == 1:
            return [self._eval(script, *calls[0])]
        client = self._conn()
        if self._waits is not None and self._waits.covers(script):
            return self._waits.eval_many(client, script, calls)
        replies = pipeline_eval(client, script, calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, self._noscript)]
        if missing:
            script.sha = client.script_load(script.script)
            again = pipeline_eval(client, script, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    # -- lifecycle ------------------------------------------------------------------------
    def create_schema(self) -> None:
        """Nothing to create (each shard's token counter is made by its first claim); loads
        the scripts (on every primary in Cluster), which also proves the server is
        reachable.  Idempotent."""
        try:
            client = self._conn()
            for script in self._scripts.values():
                script.sha = client.script_load(script.script)
        except self._errors as exc:
            raise unavailable("create_schema", exc) from exc

    def drop_schema(self) -> None:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        pattern = glob_escape(self.prefix) + ":{*"
        try:
            client = self._conn()
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), SCAN_CHUNK):
                pipe = client.pipeline(transaction=False)
                for key in keys[i : i + SCAN_CHUNK]:
                    command(pipe, "UNLINK", key)
                pipe.execute()
        except self._errors as exc:
            raise unavailable("drop_schema", exc) from exc

    def close(self) -> None:
        """Close the connection pool if this store built the client (a client passed in
        belongs to the caller), and the hot path's per-thread connections (always ours)."""
        if self._direct is not None:
            self._direct.close()
        client = self._client
        if not self._owned or client is None:
            return
        client.close()
        if self._url is not None and self._url.startswith(CLUSTER_SCHEME):
            self._client = None  # rebuilt on next use, like the first time


def _check_options(
    prefix: str, connect_timeout: float, socket_timeout: float, gc_ttl: float
) -> None:
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError("prefix must be non-empty and free of '{' and '}' (hash tags)")
    if gc_ttl <= 0:
        raise ConfigurationError("gc_ttl must be positive (and exceed the handler's ttl)")
    if connect_timeout <= 0 or socket_timeout <= 0:
        raise ConfigurationError("connect_timeout and socket_timeout must be > 0")
