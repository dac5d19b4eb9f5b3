"""Redis stores: records and retry counters in Redis, every state change one Lua script.

:class:`RedisStore` (blocking) and :class:`AsyncRedisStore` (``redis.asyncio``, see
:mod:`idempotent_tasks.stores.async_redis`) are one protocol (``_protocol``: keys, which
script each primitive runs with which arguments, reply parsing, multi-step primitives as
plans of commands) on two transports (``_transport``) over redis-py's documented client API;
they share records, keys and scripts, so sync workers and async web processes may use one
Redis together.

* Guarantee: every primitive of the store contract (``stores/base.py``) is one atomic
  ``EVALSHA`` of a script shipped in ``stores/redis/lua/``; ``create`` returns the existing
  record in the same round trip on DUPLICATE (replacing an *expired* record takes a second,
  equally atomic script that re-checks the expiry and also resets the counter).  The batch
  primitives (``create_many``, ``mark_success_many``) are one script call per 500 scopes
  (per shard on Redis Cluster), each scope in it decided on its own, atomically.
  Durability is Redis's own: with ``appendonly yes`` and ``appendfsync always`` a claim
  survives a server crash; with snapshots or no persistence a restart forgets claims (and
  duplicates may then run again).  A failover to a replica that had not received the last
  writes forgets them too, unless ``wait_replicas=N``: then every claim (a takeover and a
  reopen included), heartbeat and outcome write is followed by ``WAIT N wait_timeout`` in
  the same round trip and is acknowledged only once ``N`` replicas have it (short:
  ``STORE_UNAVAILABLE`` before the body, ``OUTCOME_NOT_RECORDED`` after; see
  ``_replication`` and docs/redis.md).  With ``wait_replicas=0`` (the default) nothing of
  this is sent.
* Atomic primitive: Lua scripts (``EVALSHA``, loaded again on ``NOSCRIPT``), each touching
  only keys of one hash slot, so the same scripts run on a standalone server and on Redis
  Cluster.  No check-then-act across round trips anywhere.
* Fencing tokens: each shard has a counter key, ``INCR``\\ ed inside the claim, batch claim,
  takeover and reopen scripts only when a record is actually created, replaced, taken over
  or reopened (a duplicate writes nothing).  The token is the counter followed by the
  shard's number in three decimal digits (``<counter><000-255>``): it grows per scope (a
  scope always lives in its shard) and no two attempts of any scopes share one, at no extra
  round trip.  A record written by an earlier version (random 62-bit tokens) is accounted
  for when replaced, taken over or reopened: the shard's counter then moves past its token.
  The counters never expire; like the records, they are lost with the data when Redis
  loses it.
* Keys: a scope is hashed (SHA-256 of :meth:`Scope.encoded`, length-prefixed and so
  collision-free, first 32 hex digits = the *member*); the first two hex digits pick one of
  256 *shards*, and the shard is the hash tag::

      <prefix>:{<shard>}:<member>:r   record (hash: status, hash, response, token, times, scope)
      <prefix>:{<shard>}:<member>:c   retry counter (hash: n, ua, and s: the recorded steps),
                                      lives apart from the record
      <prefix>:{<shard>}:p            PROCESSING members scored by lease expiry
      <prefix>:{<shard>}:f            SUCCESS/FAILED members scored by expires_at, UNCERTAIN
                                      ones at +inf (listed, never due)
      <prefix>:{<shard>}:ci           counter members scored by their last change
      <prefix>:{<shard>}:t            the shard's fencing-token counter (never expires)
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
  released scope's counter ``gc_ttl`` from its last change.  An UNCERTAIN record and its
  counter (its recorded steps) get none: they wait for an operator.  **gc_ttl must exceed the
  handler's ``ttl``** (the counter must live at least ``ttl`` after its last change) and
  its ``lease_timeout``; the default is 7 days.
* Round trips: one per claim and one per completion; a batch is one pipeline.  The blocking
  transport keeps one connection per thread for a standalone client with a plain pool
  (``_direct``: redis-py's own connection class, ``send_command`` / ``read_response``,
  without the pool's checkout per command); other clients are used as they are.
* Failures: bounded connect and socket timeouts and no automatic retries (a retried write
  could report a stale outcome; the handler has its own bounded retry).  Every driver error
  becomes :class:`~idempotent_tasks.StoreUnavailableError` at the transport, before the
  body runs (fail closed); a bad prefix, timeout or ``gc_ttl`` raises
  :class:`~idempotent_tasks.ConfigurationError`.  Constructors never connect.
* Change feed (``stores.changes``, for ``on_in_progress="wait"``): ``announce_change`` is
  one ``PUBLISH`` of a digest of the scope on ``<prefix>:changes``;
  ``wait_for_change`` blocks on an event that the store's one subscription per process (a
  thread; per event loop, a task, for the async store) sets; plain pub/sub in Cluster too
  (see ``_pubsub``).
* URL: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS, ``unix://`` for a
  socket); ``redis+cluster://host:port`` for Redis Cluster (the cluster client is built on
  first use).  Or pass a ``redis.Redis`` / ``redis.cluster.RedisCluster`` client, or a
  Sentinel's ``master_for(...)`` client (each is used as is: disable its automatic retries,
  since a retried write may report a stale outcome).
  Needs ``pip install 'idempotent-tasks[redis]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._async_store import DEFAULT_MAX_CONNECTIONS, AsyncRedisStore
from ._client import (
    CLUSTER_SCHEME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_GC_TTL,
    DEFAULT_PREFIX,
    DEFAULT_SOCKET_TIMEOUT,
    INSTALL_HINT,
    build_client,
    command,
    driver_errors,
    import_redis,
)
from ._records import DIGEST_DIGITS, SHARD_DIGITS
from ._replication import DEFAULT_WAIT_TIMEOUT
from ._store import CLAIM_CHUNK, RedisStore

if TYPE_CHECKING:
    from ._client import AsyncClient as AsyncClient
    from ._client import Client as Client

__all__ = [
    "CLAIM_CHUNK",
    "CLUSTER_SCHEME",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_GC_TTL",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PREFIX",
    "DEFAULT_SOCKET_TIMEOUT",
    "DEFAULT_WAIT_TIMEOUT",
    "DIGEST_DIGITS",
    "INSTALL_HINT",
    "SHARD_DIGITS",
    "AsyncRedisStore",
    "RedisStore",
    "build_client",
    "command",
    "driver_errors",
    "import_redis",
]
