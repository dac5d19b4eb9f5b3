"""Redis store: records and retry counters in Redis, every state change one Lua script.

* Guarantee: every primitive of the store contract (``stores/base.py``) is one atomic
  ``EVALSHA`` of a script shipped in ``stores/lua/``; ``create`` returns the existing record
  in the same round trip on DUPLICATE (replacing an *expired* record takes a second,
  equally atomic script that re-checks the expiry and also resets the counter).
  Durability is Redis's own: with ``appendonly yes`` and ``appendfsync always`` a claim
  survives a server crash; with snapshots or no persistence a restart forgets claims (and
  duplicates may then run again).  A failover to a replica that had not received the last
  writes forgets them too.
* Atomic primitive: Lua scripts (``EVALSHA``, loaded again on ``NOSCRIPT``), each touching
  only keys of one hash slot, so the same scripts run on a standalone server and on Redis
  Cluster.  No check-then-act across round trips anywhere.
* Keys: a scope is hashed (SHA-256 of :meth:`Scope.encoded`, length-prefixed and so
  collision-free, first 32 hex digits = the *member*); the first two hex digits pick one of
  256 *shards*, and the shard is the hash tag::

      <prefix>:{<shard>}:<member>:r   record (hash: status, hash, response, token, times, scope)
      <prefix>:{<shard>}:<member>:c   retry counter (hash: n, ua), lives apart from the record
      <prefix>:{<shard>}:p            PROCESSING members scored by lease expiry
      <prefix>:{<shard>}:f            SUCCESS/FAILED members scored by expires_at
      <prefix>:{<shard>}:ci           counter members scored by their last change
      <prefix>:{lock}:<name>          maintenance leases

  Braces in a tenant or key never reach a key name (only the digest does), and the scope's
  fields are stored in the record and compared on every read, so even a digest collision
  could not serve another scope's record.  Why a shard rather than the scope's own digest
  as hash tag: in Cluster a script may only touch keys of one slot, so with a tag per
  scope the maintenance index could only be updated best effort, outside the script;
  with 256 shard tags the index lives in the records' slot and stays exact, while the
  keys still spread over 256 slots (and so over every master).
* Index: because a shard's index keys carry the same hash tag as its records, the scripts
  update the index *inside the same atomic step* in standalone and Cluster mode alike;
  the index is never stale because of a race.  It can only hold entries whose keys Redis
  garbage-collected (see TTL); maintenance drops those when it meets them.  Correctness
  never depends on the index: ``find_stuck`` re-reads each candidate, the handler then acts
  through the conditional scripts, and ``delete_expired`` re-checks each record inside the
  per-shard purge script.  ``list_records`` and ``stats`` read every shard's index: they
  are operator tools, not hot path.
* TTL: expiry and leases are decided by the handler's clock from stored timestamps (the
  ``now`` it passes in), never by Redis's clock.  Redis TTLs are only garbage collection,
  set well beyond the logical expiry: a PROCESSING record gets ``lease remaining +
  gc_ttl``, a finished record and its counter ``max(expires_at - now, 0) + gc_ttl``, a
  released scope's counter ``gc_ttl`` from its last change.  **gc_ttl must exceed the
  handler's ``ttl``** (the counter must live at least ``ttl`` after its last change) and
  its ``lease_timeout``; the default is 7 days.
* URL: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS, ``unix://`` for a
  socket); ``redis+cluster://host:port`` for Redis Cluster (the cluster client is built on
  first use).  Or pass a ``redis.Redis`` / ``redis.cluster.RedisCluster`` client (it is used
  as is: disable its automatic retries, since a retried write may report a stale outcome).
  Needs ``pip install 'idempotent-tasks[redis]'``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache, partial
from importlib import resources
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from .._errors import IdempotencyError, StoreUnavailableError
from .._records import CreateOutcome, CreateResult, Scope, Status, StoredRecord
from ._redis_direct import thread_connections
from .base import ClaimRequest, FailureResult, SuccessWrite

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
#: Hex digits of the scope digest that pick the shard (2 → 256 shards / hash slots).
SHARD_DIGITS: Final = 2
#: Hex digits of the scope digest used in key names (128 bits).
DIGEST_DIGITS: Final = 32
#: Claims per script call in ``create_many`` (bounds the time one script blocks Redis).
CLAIM_CHUNK: Final = 500
#: Records read per round trip by the operator scans.
SCAN_CHUNK: Final = 1000
CLUSTER_SCHEME: Final = "redis+cluster://"
INSTALL_HINT: Final = "the redis extra is not installed: pip install 'idempotent-tasks[redis]'"

_FIELDS: Final = ("st", "rh", "rs", "tk", "ca", "ua", "le", "ea", "sc")
_STATUS: Final = {s.value.encode(): s for s in Status}
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
def _script_text(name: str) -> bytes:
    package = resources.files(__package__ or "idempotent_tasks.stores")
    return package.joinpath("lua", f"{name}.lua").read_bytes()


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


def _unavailable(call: str, exc: BaseException, scope: Scope | None = None) -> IdempotencyError:
    return StoreUnavailableError(
        f"redis store: {call} failed: {type(exc).__name__}: {exc}",
        tenant=scope.tenant if scope else None,
        operation=scope.operation if scope else None,
        key=scope.key if scope else None,
    )


def _opt(raw: bytes) -> float | None:
    return float(raw) if raw else None


def _record(scope: Scope, v: Sequence[bytes]) -> StoredRecord:
    """A record from its fields in ``_FIELDS`` order (a flat array: no dict building)."""
    status = _STATUS[v[0]]
    return StoredRecord(
        scope=scope,
        status=status,
        request_hash=v[1].decode(),
        response=v[2] if status is Status.SUCCESS else None,
        fencing_token=int(v[3]),
        created_at=float(v[4]),
        updated_at=float(v[5]),
        lease_expires_at=_opt(v[6]),
        expires_at=_opt(v[7]),
    )


def _unpack(scope: Scope, raw: bytes) -> StoredRecord:
    """A record packed by ``claim.lua`` (one bulk string: cheaper to read than an array)."""
    st, tk, ca, ua, le, ea, n, rest = raw.split(b"\n", 7)
    status = _STATUS[st]
    cut = int(n)
    return StoredRecord(
        scope=scope,
        status=status,
        request_hash=rest[:cut].decode(),
        response=rest[cut:] if status is Status.SUCCESS else None,
        fencing_token=int(tk),
        created_at=float(ca),
        updated_at=float(ua),
        lease_expires_at=_opt(le),
        expires_at=_opt(ea),
    )


def _scope_of(v: Sequence[bytes]) -> Scope:
    """The scope stored in a record (its ``Scope.encoded()`` form: each part
    length-prefixed, lengths in characters)."""
    text, parts, i = v[8].decode(), [], 0
    for _ in range(3):
        colon = text.index(":", i)
        start = colon + 1
        end = start + int(text[i:colon])
        parts.append(text[start:end])
        i = end + 1
    return Scope(*parts)


class _Keys:
    """Key names of one scope (all with the scope's shard as hash tag), and the scope's
    encoded form, which the record stores and every read compares."""

    __slots__ = (
        "counter",
        "counter_index",
        "encoded",
        "finished",
        "member",
        "processing",
        "record",
    )

    def __init__(self, encoded: bytes, member: str, base: str, shard: tuple[str, str, str]) -> None:
        self.encoded = encoded
        self.member = member
        self.record = f"{base}{member}:r"
        self.counter = f"{base}{member}:c"
        self.processing, self.finished, self.counter_index = shard


class RedisStore:
    """The store contract on Redis or Redis Cluster (see the module docstring)."""

    name = "redis"

    def __init__(
        self,
        url_or_client: str | Client,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        gc_ttl: float = DEFAULT_GC_TTL,
    ) -> None:
        redis = import_redis()
        from redis.commands.core import Script

        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError("prefix must be non-empty and free of '{' and '}' (hash tags)")
        if gc_ttl <= 0:
            raise ValueError("gc_ttl must be positive (and exceed the handler's ttl)")
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
        self._shards: dict[str, tuple[str, str, str]] = {}
        self._bases: dict[str, str] = {}
        for i in range(16**SHARD_DIGITS):
            shard = f"{i:0{SHARD_DIGITS}x}"
            base = f"{prefix}:{{{shard}}}:"
            self._bases[shard] = base
            self._shards[shard] = (f"{base}p", f"{base}f", f"{base}ci")

    # -- plumbing -----------------------------------------------------------------------
    def _register(self, script_class: type[Script]) -> dict[str, Script]:
        """Every script, registered once: the SHA-1 is computed here, locally (nothing is
        sent until first use); a lazily built cluster client gets the same objects."""
        if self._client is not None:
            return {n: self._client.register_script(_script_text(n)) for n in _SCRIPTS}
        return {n: script_class(None, _script_text(n)) for n in _SCRIPTS}  # type: ignore[arg-type]

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

    def _keys(self, scope: Scope) -> _Keys:
        encoded = scope.encoded().encode()
        member = hashlib.sha256(encoded).hexdigest()[:DIGEST_DIGITS]
        shard = member[:SHARD_DIGITS]
        return _Keys(encoded, member, self._bases[shard], self._shards[shard])

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA, loading the script once more when the server does not know it (first
        use, restart, failover).  NOSCRIPT means nothing ran, so running again is safe."""
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
            raise _unavailable(call, exc, scope) from exc

    # -- claims -------------------------------------------------------------------------
    def create(
        self, scope: Scope, *, request_hash: str, token: int, now: float, lease_expires_at: float
    ) -> CreateResult:
        """One ``claim.lua`` call (two keys: the hot path).  Only when it finds the record
        expired does a second call, ``claim_many.lua``, re-check and replace it atomically
        together with the counter reset."""
        k = self._keys(scope)
        args = (now, lease_expires_at, self._gc_ms, k.encoded, request_hash, token)
        try:
            reply = self._eval(self._claim, (k.record, k.processing), args)
            if reply == 2:
                keys = (k.record, k.counter, k.processing, k.finished, k.counter_index)
                reply = self._eval(self._claim_many, keys, args)
        except self._errors as exc:
            raise _unavailable("create", exc, scope) from exc
        return _claim_result(scope, reply, request_hash, token, now, lease_expires_at)

    def create_many(
        self, claims: Sequence[ClaimRequest], *, now: float, lease_expires_at: float
    ) -> list[CreateResult]:
        """One script call per chunk (standalone) or per shard (Cluster: a script may only
        touch one slot), all sent in one pipeline; each claim stays individually atomic."""
        if not claims:
            return []
        keyed = [(c, self._keys(c.scope)) for c in claims]
        groups = self._claim_groups(keyed)
        calls = [self._claim_call(keyed, g, now, lease_expires_at) for g in groups]
        try:
            replies = self._eval_many(self._claim_many, calls)
        except self._errors as exc:
            raise _unavailable("create_many", exc) from exc
        results: list[CreateResult | None] = [None] * len(claims)
        for group, reply in zip(groups, replies, strict=True):
            items = reply if len(group) > 1 else [reply]  # one claim: a bare item
            for i, item in zip(group, items, strict=True):
                c = claims[i]
                results[i] = _claim_result(
                    c.scope, item, c.request_hash, c.token, now, lease_expires_at
                )
        return [r for r in results if r is not None]

    def _claim_groups(self, keyed: Sequence[tuple[ClaimRequest, _Keys]]) -> list[list[int]]:
        if self._cluster:
            by_shard: dict[str, list[int]] = {}
            for i, (_, k) in enumerate(keyed):
                by_shard.setdefault(k.member[:SHARD_DIGITS], []).append(i)
            groups = list(by_shard.values())
        else:
            groups = [list(range(len(keyed)))]
        return [g[i : i + CLAIM_CHUNK] for g in groups for i in range(0, len(g), CLAIM_CHUNK)]

    def _claim_call(
        self,
        keyed: Sequence[tuple[ClaimRequest, _Keys]],
        group: Sequence[int],
        now: float,
        lease: float,
    ) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = [now, lease, self._gc_ms]
        for i in group:
            c, k = keyed[i]
            keys += (k.record, k.counter, k.processing, k.finished, k.counter_index)
            args += (k.encoded, c.request_hash, c.token)
        return keys, args

    def _eval_many(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Several calls of one script: directly when there is one, else in one pipeline;
        calls refused with NOSCRIPT (which ran nothing) are sent again after loading."""
        if len(calls) == 1:
            return [self._eval(script, *calls[0])]
        client = self._conn()
        replies = _pipeline_eval(client, script, calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, self._noscript)]
        if missing:
            script.sha = client.script_load(script.script)
            again = _pipeline_eval(client, script, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    def get(self, scope: Scope) -> StoredRecord | None:
        k = self._keys(scope)
        try:
            v = command(self._conn(), "HMGET", k.record, *_FIELDS)
        except self._errors as exc:
            raise _unavailable("get", exc, scope) from exc
        if v[0] is None or v[8] != k.encoded:
            return None
        return _record(scope, v)

    # -- conditional writes -------------------------------------------------------------
    def take_over(
        self,
        scope: Scope,
        *,
        expected_token: int,
        new_token: int,
        now: float,
        lease_expires_at: float,
    ) -> int | None:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.counter_index)
        args = (expected_token, new_token, now, lease_expires_at, self._gc_ms)
        n = self._run("take_over", scope, keys, args)
        return None if n < 0 else int(n)

    def heartbeat(self, scope: Scope, *, token: int, now: float, lease_expires_at: float) -> bool:
        k = self._keys(scope)
        args = (token, now, lease_expires_at, self._gc_ms)
        return bool(self._run("heartbeat", scope, (k.record, k.processing), args))

    def mark_success(
        self, scope: Scope, *, token: int, response: bytes, now: float, expires_at: float
    ) -> bool:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, response, now, expires_at, self._gc_ms)
        try:
            return bool(self._eval(self._mark_success, keys, args))
        except self._errors as exc:
            raise _unavailable("mark_success", exc, scope) from exc

    def mark_success_many(self, writes: Sequence[SuccessWrite], *, now: float) -> list[bool]:
        """``mark_success.lua`` once per write, all in one pipeline (each call stays atomic
        and conditional on its own token)."""
        if not writes:
            return []
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        for w in writes:
            k = self._keys(w.scope)
            calls.append((
                (k.record, k.counter, k.processing, k.finished),
                (w.token, w.response, now, w.expires_at, self._gc_ms),
            ))
        try:
            return [bool(r) for r in self._eval_many(self._mark_success, calls)]
        except self._errors as exc:
            raise _unavailable("mark_success_many", exc) from exc

    def mark_failed(
        self,
        scope: Scope,
        *,
        token: int,
        now: float,
        expires_at: float,
        only_if_lease_expired: bool = False,
    ) -> bool:
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished)
        args = (token, now, expires_at, int(only_if_lease_expired), self._gc_ms)
        return bool(self._run("mark_failed", scope, keys, args))

    def release(self, scope: Scope, *, token: int) -> bool:
        k = self._keys(scope)
        return bool(self._run("release", scope, (k.record, k.processing), (token,)))

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
        k = self._keys(scope)
        keys = (k.record, k.counter, k.processing, k.finished, k.counter_index)
        flag = int(only_if_lease_expired)
        args = (token, now, max_retries, expires_at, flag, self._gc_ms)
        reply = self._run("record_failure", scope, keys, args)
        if not isinstance(reply, list):
            return None
        return FailureResult(int(reply[0]), poisoned=bool(reply[1]))

    # -- counters and operator actions --------------------------------------------------
    def get_retry_count(self, scope: Scope) -> int:
        k = self._keys(scope)
        try:
            n = command(self._conn(), "HGET", k.counter, "n")
        except self._errors as exc:
            raise _unavailable("get_retry_count", exc, scope) from exc
        return int(n) if n else 0

    def reset_retry_count(self, scope: Scope) -> None:
        k = self._keys(scope)
        self._run("reset_retry_count", scope, (k.counter, k.counter_index), ())

    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        k = self._keys(scope)
        keys = (k.record, k.processing, k.finished)
        v = self._run("delete_record", scope, keys, (status.value if status else "",))
        return _record(scope, v) if isinstance(v, list) else None

    # -- maintenance --------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        """Candidates come from each shard's processing index in lease-expiry order; each is
        re-read and kept only if its own fields say it is stuck.  The result is sorted by
        ``updated_at`` (oldest first) and cut to ``limit``; when more than ``limit`` records
        are stuck, those whose leases expired first are the ones considered."""
        if limit <= 0:
            return []
        try:
            found = self._scan_stuck(now, heartbeat_before, limit)
        except self._errors as exc:
            raise _unavailable("find_stuck", exc) from exc
        found.sort(key=lambda r: r.updated_at)
        return found[:limit]

    def _scan_stuck(
        self, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        page = max(limit, 100)
        offsets = dict.fromkeys(self._shards, 0)
        found: list[StoredRecord] = []
        while offsets and len(found) < limit:
            pages = self._index_pages(offsets, now, page)
            for shard, members in pages.items():
                kept, dropped = self._check_stuck(shard, members, now, heartbeat_before)
                found += kept
                offsets[shard] += len(members) - dropped
                if len(members) < page:
                    del offsets[shard]
        return found

    def _index_pages(
        self, offsets: Mapping[str, int], now: float, page: int
    ) -> dict[str, list[bytes]]:
        pipe = self._conn().pipeline(transaction=False)
        for shard, offset in offsets.items():
            processing = self._shards[shard][0]
            command(pipe, "ZRANGEBYSCORE", processing, "-inf", now, "LIMIT", offset, page)
        return dict(zip(offsets, pipe.execute(), strict=True))

    def _check_stuck(
        self, shard: str, members: Sequence[bytes], now: float, heartbeat_before: float | None
    ) -> tuple[list[StoredRecord], int]:
        """The stuck records among ``members``, and how many index entries left the
        ``<= now`` window: dropped (record GC'd by Redis, or no longer PROCESSING) or
        re-scored from the record's own lease, decided by a script on the record."""
        kept: list[StoredRecord] = []
        dropped = 0
        base, processing = self._bases[shard], self._shards[shard][0]
        for member, v in zip(members, self._read_records(base, members), strict=True):
            if v[0] != b"PROCESSING" or (v[6] and float(v[6]) > now):
                record_key = f"{base}{member.decode()}:r"
                self._eval(self._scripts["prune_processing"], (record_key, processing), ())
                dropped += 1
                continue
            record = _record(_scope_of(v), v)
            if heartbeat_before is None or record.updated_at < heartbeat_before:
                kept.append(record)
        return kept, dropped

    def _read_records(self, base: str, members: Sequence[bytes]) -> list[Sequence[bytes]]:
        rows: list[Sequence[bytes]] = []
        for i in range(0, len(members), SCAN_CHUNK):
            pipe = self._conn().pipeline(transaction=False)
            for m in members[i : i + SCAN_CHUNK]:
                command(pipe, "HMGET", f"{base}{m.decode()}:r", *_FIELDS)
            rows += pipe.execute()
        return rows

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        """One purge script per shard that has work (found with one pipelined ``ZCOUNT``
        round), each re-checking every candidate against the record itself."""
        try:
            return self._purge(now, counters_before, max(limit, 0))
        except self._errors as exc:
            raise _unavailable("delete_expired", exc) from exc

    def _purge(self, now: float, counters_before: float, limit: int) -> int:
        pipe = self._conn().pipeline(transaction=False)
        for _, finished, counters in self._shards.values():
            command(pipe, "ZCOUNT", finished, "-inf", now)
            command(pipe, "ZCOUNT", counters, "-inf", f"({counters_before!r}")
        counts = iter(pipe.execute())
        busy = [s for s in self._shards if next(counts) + next(counts) > 0]
        purged = 0
        for shard in busy:
            _, finished, counters = self._shards[shard]
            args = (now, counters_before, limit - purged, max(limit, 1), self._bases[shard])
            reply = self._eval(self._scripts["purge_shard"], (finished, counters), args)
            purged += int(reply[0])
        return purged

    def _all_records(self) -> Iterator[StoredRecord]:
        pipe = self._conn().pipeline(transaction=False)
        for processing, finished, _ in self._shards.values():
            command(pipe, "ZRANGE", processing, 0, -1)
            command(pipe, "ZRANGE", finished, 0, -1)
        pages = iter(pipe.execute())
        for shard in self._shards:
            members = sorted(set(next(pages)) | set(next(pages)))
            for v in self._read_records(self._bases[shard], members):
                if v[0] is not None and v[8] is not None:
                    yield _record(_scope_of(v), v)

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        try:
            rows = [
                r
                for r in self._all_records()
                if (status is None or r.status is status)
                and (operation is None or r.scope.operation == operation)
                and (tenant is None or r.scope.tenant == tenant)
            ]
        except self._errors as exc:
            raise _unavailable("list_records", exc) from exc
        rows.sort(key=lambda r: (r.created_at, r.scope.tenant, r.scope.operation, r.scope.key))
        return rows[offset : offset + limit]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        counts: dict[tuple[str, Status], int] = {}
        try:
            for r in self._all_records():
                k = (r.scope.operation, r.status)
                counts[k] = counts.get(k, 0) + 1
        except self._errors as exc:
            raise _unavailable("stats", exc) from exc
        return counts

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        args = (owner, now, now + ttl, self._gc_ms)
        return bool(self._run("acquire_lock", None, (self._lock_key(name),), args))

    def release_lock(self, name: str, *, owner: str) -> None:
        self._run("release_lock", None, (self._lock_key(name),), (owner,))

    def _lock_key(self, name: str) -> str:
        return f"{self.prefix}:{{lock}}:{name}"

    # -- lifecycle ----------------------------------------------------------------------
    def create_schema(self) -> None:
        """Nothing to create; loads the scripts (on every primary in Cluster), which also
        proves the server is reachable.  Idempotent."""
        try:
            client = self._conn()
            for script in self._scripts.values():
                script.sha = client.script_load(script.script)
        except self._errors as exc:
            raise _unavailable("create_schema", exc) from exc

    def drop_schema(self) -> None:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        pattern = _glob_escape(self.prefix) + ":{*"
        try:
            client = self._conn()
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), SCAN_CHUNK):
                pipe = client.pipeline(transaction=False)
                for key in keys[i : i + SCAN_CHUNK]:
                    command(pipe, "UNLINK", key)
                pipe.execute()
        except self._errors as exc:
            raise _unavailable("drop_schema", exc) from exc

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


def _claim_result(
    scope: Scope, item: Any, request_hash: str, token: int, now: float, lease: float
) -> CreateResult:
    """CREATED is built from our own arguments (nothing to parse); DUPLICATE from the
    record's fields returned by the same script call."""
    if item == 1:
        record = StoredRecord.claimed(scope, request_hash, token, now, lease)
        return CreateResult(CreateOutcome.CREATED, record)
    if item == 0:
        raise IdempotencyError(
            "redis store: scope digest collision (another scope owns this key)",
            tenant=scope.tenant,
            operation=scope.operation,
            key=scope.key,
        )
    return CreateResult(CreateOutcome.DUPLICATE, _unpack(scope, item))


def _pipeline_eval(
    client: Client, script: Script, calls: Iterable[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        command(pipe, "EVALSHA", script.sha, len(keys), *keys, *args)
    return list(pipe.execute(raise_on_error=False))


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
