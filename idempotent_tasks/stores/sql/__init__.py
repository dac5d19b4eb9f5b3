"""SQL store: PostgreSQL (psycopg 3), MySQL 8 / MariaDB 10.11 (PyMySQL) and SQLite, one
schema, one contract.

* Guarantee: every primitive of :class:`~idempotent_tasks.stores.base.Store` is atomic in the
  database, across threads, processes and hosts sharing it.  Records, retry counters and
  maintenance leases are rows in three tables; the retry counter row survives the deletion
  of its record.  Only this store supports ``execute_in_transaction``
  (``docs/transactional.md``): the body's writes and the conditional ``mark_success`` commit
  in one transaction (:meth:`SQLStore.body_transaction`).
* Atomic primitive: the primary key ``(tenant, operation, key)`` with
  ``INSERT … ON CONFLICT``.  On PostgreSQL ``create`` is one statement (and one round trip)
  that inserts, replaces an expired record (resetting its counter) or returns the live
  one; ``create_many`` claims a whole batch in one statement; ``take_over``,
  ``record_failure`` and ``reopen`` (a settled record to a new attempt, its counter reset)
  are single statements with data-modifying CTEs.  On SQLite a fresh
  claim is one autocommit ``INSERT … ON CONFLICT DO NOTHING RETURNING``; everything that reads
  before it writes runs under ``BEGIN IMMEDIATE`` (SQLite's single writer lock), so several
  OS processes and threads can share one database file.  Every write on an existing record is
  conditional on ``status = 'PROCESSING'`` and the fencing token (``reopen``'s on SUCCESS or
  FAILED and the token).
* Fencing tokens: drawn by the database inside the claim's (or takeover's, or reopen's) own
  statement, so they cost no round trip, grow per scope and are never reused.  PostgreSQL:
  the sequence ``<prefix>_fencing_seq`` (``BIGINT``, ``CACHE 1``: values grow in real-time
  order across sessions; a value drawn by an insert that then conflicted is a gap).  SQLite:
  the one-row table ``<prefix>_fencing`` (``last_token``), read by the claim's INSERT under
  the write lock and raised by ``AFTER INSERT`` / ``AFTER UPDATE OF fencing_token``
  triggers.  MySQL: the records table's ``AUTO_INCREMENT`` column, drawn by the claim's own
  INSERT (and by the ``REPLACE`` of a takeover or a reopen) and returned with the
  statement's answer (``_mysql.py``).  ``create_schema()`` creates them, on a database made
  by an earlier version too, starting above the largest token stored there.
* TTL: nothing expires by itself.  Timestamps are epoch seconds from the handler's clock,
  stored as ``DOUBLE PRECISION``; the database server's clock is never used.  ``create``
  treats a record with ``expires_at <= now`` as absent; ``delete_expired`` purges in batches
  (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so many workers can run it at once).
* Hot path: every primitive is a *plan* (``protocol.py``: statements yielded, answers sent
  back, no driver call), written once and driven by this store on a DBAPI cursor and by
  ``AsyncSQLStore`` on an async connection.  The sync store runs the plans' pre-built SQL on
  DBAPI connections kept in a small LIFO free list (autocommit), bypassing SQLAlchemy's
  execution layer; SQLAlchemy provides the engine and pool, the schema and the body
  transaction.
* Prepared statements (``prepare=``, PostgreSQL): with ``prepare=True`` (the default)
  psycopg prepares the statements that repeat, server-side, per connection.
  ``prepare=False`` sends no named prepared statement at all (psycopg
  ``prepare_threshold=None`` on every connection, the engine's ``connect_args`` included,
  and on the connections of an ``Engine`` passed in): required behind PgBouncer in
  ``transaction`` (or ``statement``) pool mode, where consecutive statements of one
  connection may reach different server sessions.  Nothing else relies on session state:
  every primitive is one autocommit statement or one transaction, and ``create_schema()``
  runs in one transaction (its advisory lock is transaction-scoped), so it works through
  such a pooler too.
* Change feed (PostgreSQL; ``_feed.py``): ``announce_change`` / ``wait_for_change``
  (``stores.changes``) through ``LISTEN``/``NOTIFY`` on the channel ``<prefix>_changes``,
  one listening connection and thread per store and process.  ``prepare=False`` (PgBouncer
  in transaction mode, where ``LISTEN`` cannot work) leaves them out unless
  ``listen_url=`` names a direct PostgreSQL URL for the listener; SQLite and MySQL stores
  do not have them (their waiters poll).
* Failover (``require_synchronous_replication=True``, PostgreSQL): every new connection
  checks that the server's commits wait for a standby (``synchronous_standby_names`` set,
  ``synchronous_commit`` not ``off``/``local``, not a standby itself) and is a
  :class:`~idempotent_tasks.ConfigurationError` otherwise: with asynchronous replication a
  promotion can lose outcomes the store reported as recorded (docs/guarantees.md).
* Failures: a database without the store's tables or sequence raises
  :class:`~idempotent_tasks.ConfigurationError` ("schema not created: run
  ``idempotent-tasks migrate``"); every other driver or pool error becomes
  :class:`~idempotent_tasks.StoreUnavailableError`.  A connection that failed is discarded;
  when it was lost (e.g. PostgreSQL restarted) every idle connection is discarded too, so
  the next call reconnects without manual steps.  On PostgreSQL every call has a deadline
  (``socket_timeout``, default 30 s): a call on a link that went silent has its connection
  broken by a watchdog thread and fails closed instead of hanging until TCP gives up.
* MySQL/MariaDB (``_mysql.py``): claims are ``INSERT IGNORE`` (one statement; a duplicate then
  reads the record), multi-statement primitives are short transactions that lock the record
  first, connections run ``READ COMMITTED`` (no gap locks), deadlock victims run again, and
  ``delete_expired`` uses ``FOR UPDATE SKIP LOCKED``; scope columns are byte-exact
  ``VARBINARY``; ``socket_timeout`` becomes PyMySQL's read/write timeouts (a silent link fails
  closed).  Transactional mode works the same on InnoDB.
* Connection string: ``postgresql+psycopg://user:pass@host:5432/db`` (``postgresql://`` means
  psycopg 3 too; behind PgBouncer in transaction mode add ``prepare=False``),
  ``mysql+pymysql://user:pass@host:3306/db`` (``mysql://`` and ``mariadb+pymysql://`` too),
  ``sqlite:///path/to/idem.db``, or a SQLAlchemy ``Engine`` using psycopg, PyMySQL or the
  stdlib sqlite3 driver.  The constructor never connects.

The schema: :func:`build_metadata` (the three tables as SQLAlchemy Core) and
:data:`POSTGRESQL_DDL` (what ``create_schema()`` emits on a fresh PostgreSQL database with the
default prefix, sequence included), both built from code.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from ._schema import DEFAULT_TABLE_PREFIX, build_metadata, postgresql_ddl
from ._store import SQLStore

if TYPE_CHECKING:
    #: The DDL ``create_schema()`` emits on PostgreSQL with the default prefix (for the docs).
    POSTGRESQL_DDL: str


@cache
def _default_ddl() -> str:
    return postgresql_ddl(DEFAULT_TABLE_PREFIX)


def __getattr__(name: str) -> str:
    """``POSTGRESQL_DDL`` is compiled on first use (it needs SQLAlchemy's PostgreSQL
    dialect, which SQLite users need not import)."""
    if name == "POSTGRESQL_DDL":
        return _default_ddl()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["DEFAULT_TABLE_PREFIX", "POSTGRESQL_DDL", "SQLStore", "build_metadata"]
