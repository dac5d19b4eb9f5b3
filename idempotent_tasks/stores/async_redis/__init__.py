"""Async Redis store: RedisStore's records, keys and Lua scripts, awaited on the event loop.

* Guarantee: the same as :mod:`idempotent_tasks.stores.redis` — every primitive of the store
  contract is one atomic ``EVALSHA`` of the **same** scripts (``stores/redis/lua/``) on the
  **same** key layout, so an ``AsyncRedisStore`` and a ``RedisStore`` with the same prefix
  share their records: async web processes and sync workers may use one Redis together.
* Native asyncio: every method is a coroutine (``is_async = True``); under
  ``handler.run_async`` each store call is awaited on the running event loop, with no thread
  hop.  A store (its connections) belongs to the event loop that first uses it: build one
  per loop (e.g. in the application's lifespan), not at import time for several loops.
* Hot path: for a store built from a ``redis://`` / ``unix://`` URL with ``hiredis``
  installed, the scripts of every coroutine go out pipelined on one connection and the
  replies come back in order (``_pipe.py``); otherwise through ``redis.asyncio``'s
  connections (``_held.py``, or the client passed in).  Batches and scans always use the
  ``redis.asyncio`` client (``max_connections`` bounds its pool).
* Failures: bounded timeouts (connect 5 s, socket 5 s by default) and no automatic retries;
  a reply later than ``socket_timeout`` breaks its connection (every command in flight on it
  fails); every driver error, an unreachable server included, becomes
  :class:`~idempotent_tasks.StoreUnavailableError` at the boundary (the handler then fails
  closed: the body does not run).
* Scope: a standalone server (``redis://``, ``rediss://``, ``unix://``) or a
  ``redis.asyncio.Redis`` client passed in (used as is: disable its automatic retries).
  Redis Cluster is served by the sync :class:`~idempotent_tasks.RedisStore` only.
* Needs ``pip install 'idempotent-tasks[redis]'`` (redis-py ≥ 5 ships ``redis.asyncio``).
"""

from __future__ import annotations

from ._store import AsyncRedisStore

__all__ = ["AsyncRedisStore"]
