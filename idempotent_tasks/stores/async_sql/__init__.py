"""Async SQL store: SQLStore's schema and PostgreSQL statements on psycopg's async connections.

* Guarantee: the same as :mod:`idempotent_tasks.stores.sql` on PostgreSQL — every primitive
  of the store contract is the **same** single statement (the SQL text is built by SQLStore's
  own statement builders), on the **same** three tables and fencing sequence, so an
  ``AsyncSQLStore`` and a ``SQLStore`` with the same ``table_prefix`` share their records.
  ``run_async(transactional=True)`` runs a coroutine body in one transaction with its
  conditional SUCCESS (``body_transaction``): the body gets a ``psycopg.AsyncConnection``.
* Native asyncio: every method is a coroutine (``is_async = True``); under
  ``handler.run_async`` each statement is awaited on the running event loop, with no thread
  hop, on autocommit connections of a ``psycopg_pool.AsyncConnectionPool`` (``pool_size`` at
  most, opened on first use: the constructor never connects).  Like SQLStore's raw free
  list, idle connections stay checked out in a small LIFO list between calls (the pool's
  checkout and return cost more than a statement); the pool still connects, reconnects and
  bounds them.  The statements go through libpq directly (``_wire.py``): prepared once per
  connection, psycopg's own dumpers and loaders, the socket registered with the loop while
  the store holds the connection.  The pool belongs to the event loop that first uses the
  store: build one store per loop.
* Failures: a database without the store's tables or sequence raises
  :class:`~idempotent_tasks.ConfigurationError` ("schema not created: run
  ``idempotent-tasks migrate``"); every other driver or pool error — an unreachable server
  after ``connect_timeout`` included — becomes :class:`~idempotent_tasks.StoreUnavailableError`
  (the handler fails closed: the body does not run).  Every statement has a deadline
  (``socket_timeout``, default 30 s): one timer per store, on the oldest statement in flight,
  shuts the connection's socket down when a statement outlives it (a silent link), the call
  fails closed at once and the connection is discarded; a lost connection also drains the
  pool's idle ones.
* Schema: ``await store.create_schema()`` creates exactly what ``SQLStore.create_schema()``
  creates (it runs that migration on a worker thread: DDL is a deployment step, not the hot
  path); ``idempotent-tasks migrate`` with the same URL does the same from a shell.
* Connection string: ``postgresql+psycopg://user:pass@host:5432/db`` (``postgresql://``
  too), the strings SQLStore takes.  Use a numeric host (or a local name) where connecting
  must not resolve DNS through the loop's executor.  SQLite stays on the sync SQLStore.
* Needs ``pip install 'idempotent-tasks[postgres]'`` (psycopg 3 and psycopg_pool).
"""

from __future__ import annotations

from ._store import AsyncSQLStore

__all__ = ["AsyncSQLStore"]
