"""Async SQL store: SQLStore's schema and PostgreSQL protocol on asyncpg or psycopg's async
connections.

* Guarantee: the same as :mod:`idempotent_tasks.stores.sql` on PostgreSQL — every primitive
  of the store contract is the **same** plan (``stores/sql/protocol.py``: the same
  statements, parameters and row parsing, the same claim retry), on the **same** three
  tables and fencing sequence, so an ``AsyncSQLStore`` and a ``SQLStore`` with the same
  ``table_prefix`` share their records.  ``run_async(transactional=True)`` runs a coroutine
  body in one transaction with its conditional SUCCESS (``body_transaction``): the body gets
  the driver's connection (an asyncpg connection, or a ``psycopg.AsyncConnection``).
* Native asyncio: every method is a coroutine (an ``AsyncStore``); under
  ``handler.run_async`` each statement is awaited on the running event loop, with no thread
  hop, through the driver's documented API (``_transports.py``) on autocommit connections of
  the driver's pool (``asyncpg.Pool`` or ``psycopg_pool.AsyncConnectionPool``; ``pool_size``
  at most, opened on first use: the constructor never connects).  Like SQLStore's raw free
  list, idle connections stay checked out in a small LIFO list between calls (the pool's
  checkout and return cost more than a statement); the pool still connects, reconnects and
  bounds them.  The pool belongs to the event loop that first uses the store: build one
  store per loop.
* Prepared statements (``prepare=``): ``True`` (the default) prepares the store's statements
  once per connection (asyncpg's statement cache; psycopg ``prepare=True``).
  ``prepare=False`` sends no named prepared statement (asyncpg ``statement_cache_size=0``,
  psycopg ``prepare_threshold=None``): required behind PgBouncer in transaction mode.
* Change feed: SQLStore's ``LISTEN``/``NOTIFY`` (``_feed.py``) on the store's driver, one
  listener task per store and event loop; ``prepare=False`` needs ``listen_url=`` for it.
* Failures: a database without the store's tables or sequence raises
  :class:`~idempotent_tasks.ConfigurationError` ("schema not created: run
  ``idempotent-tasks migrate``"); every other driver or pool error — an unreachable server
  after ``connect_timeout`` included — becomes :class:`~idempotent_tasks.StoreUnavailableError`
  (the handler fails closed: the body does not run).  Every statement has a deadline
  (``socket_timeout``, default 30 s): one timer per store, on the oldest statement in flight
  (``_deadline.py``), breaks the connection of a statement that outlives it (a silent link:
  asyncpg's ``terminate()``, psycopg's socket shut down), the call fails closed at once and
  the connection is discarded; a lost connection also drains the pool's idle ones.  An idle
  connection the server closed is replaced before use on asyncpg (it reads the goodbye);
  on psycopg the next statement on it fails closed, and the call after it reconnects.
* Schema: ``await store.create_schema()`` creates exactly what ``SQLStore.create_schema()``
  creates (it runs that migration, through psycopg, on a worker thread: DDL is a deployment
  step, not the hot path); ``idempotent-tasks migrate`` with the same URL does the same from
  a shell.
* Connection string: ``postgresql+asyncpg://user:pass@host:5432/db`` (asyncpg),
  ``postgresql+psycopg://…`` (psycopg, always), or a plain ``postgresql://…``: the faster
  driver here, asyncpg (see docs/performance.md), or psycopg when only that one is
  installed.  Use a numeric host (or a local name) where connecting must not resolve DNS
  through the loop's executor.  SQLite stays on the sync SQLStore.
* Needs ``pip install 'idempotent-tasks[asyncpg]'`` (asyncpg) or ``[postgres]`` (psycopg 3
  and psycopg_pool); ``create_schema()`` needs ``[postgres]``.
"""

from __future__ import annotations

from ._store import AsyncSQLStore

__all__ = ["AsyncSQLStore"]
