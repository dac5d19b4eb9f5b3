"""Async Redis store: the Redis protocol of :mod:`idempotent_tasks.stores.redis` awaited on
the event loop through ``redis.asyncio``.

* Guarantee: the same as :class:`~idempotent_tasks.RedisStore` — it *is* the same protocol
  (one copy: keys, scripts, replies, batches, scans, the ``NOSCRIPT`` reload, ``WAIT`` for
  replicas) on an awaiting transport, so an ``AsyncRedisStore`` and a ``RedisStore`` with
  the same prefix share their records: async web processes and sync workers may use one
  Redis together.  Every primitive is one atomic ``EVALSHA`` of a script shipped in
  ``stores/redis/lua/``; TTLs are garbage collection only, expiry and leases are decided by
  the handler's clock (see the sync store's spec sheet).
* Native asyncio: every method is a coroutine (an ``AsyncStore``); under
  ``handler.run_async`` each store call is awaited on the running event loop, with no thread
  hop.  A store (its connections) belongs to the event loop that first uses it: build one
  per loop (e.g. in the application's lifespan), not at import time for several loops.
* Round trips: one per claim and one per completion; batches as pipelines.  A standalone
  client with a plain pool (a ``redis://`` URL) runs them on the store's held connections
  of its event loop (the pool's own connection class and settings, redis-py's
  ``send_packed_command`` / ``read_response``; no pool checkout per command); Cluster,
  Sentinel and custom pools through the client's ``execute_command`` / ``pipeline``.  At
  most ``max_connections`` steps are in flight at once (default 50, also the bound on the
  held connections and the size of the pool of a client built from a URL); more wait
  their turn.
* Failures: bounded timeouts (connect 5 s, socket 5 s by default) and no automatic retries;
  a step (its send and its replies) later than ``socket_timeout`` fails and redis-py drops
  that connection;
  every driver error, an unreachable server included, becomes
  :class:`~idempotent_tasks.StoreUnavailableError` at the boundary (the handler then fails
  closed: the body does not run).  ``wait_replicas=N`` works as for ``RedisStore``.
  Constructors never connect; a bad option is a :class:`~idempotent_tasks.ConfigurationError`.
* URL: ``redis://``, ``rediss://``, ``unix://`` (standalone) or ``redis+cluster://host:port``
  (``redis.asyncio.cluster.RedisCluster``, which connects on first use).  Or pass a
  ``redis.asyncio.Redis`` / ``redis.asyncio.cluster.RedisCluster`` client, or a
  ``redis.asyncio.sentinel.Sentinel(...).master_for(...)`` client (used as is: disable its
  automatic retries).  Needs ``pip install 'idempotent-tasks[redis]'``.
"""

from __future__ import annotations

from ..redis import DEFAULT_MAX_CONNECTIONS, AsyncRedisStore

__all__ = ["DEFAULT_MAX_CONNECTIONS", "AsyncRedisStore"]
