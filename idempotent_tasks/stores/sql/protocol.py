"""The SQL package's protocol surface: what the library's other SQL-backed parts (the Django
store, the transactional outbox) and the async store share with ``SQLStore``.

* Plans (pure): :class:`Statement`, :data:`ROWS` / :data:`COUNT`, :class:`CommonPlans`,
  :class:`PostgresPlans` and :func:`dialect_plans` — every primitive as a generator that
  yields statements and receives their answers, driven by a transport (a DBAPI cursor, a
  ``psycopg.AsyncConnection``, an asyncpg connection).  :func:`drive` runs one on a DBAPI
  cursor.
* Statements and rows: :class:`Common` (the single statements every dialect shares),
  :func:`pyformat` / :func:`identity` (placeholder styles), :func:`scope_params`,
  :func:`record`.
* Schema: :data:`DEFAULT_TABLE_PREFIX`, :func:`build_metadata`, :func:`fencing_sequence`,
  :func:`fencing_table`, :func:`refuse_mismatch`, :func:`register_schema_extension` (tables
  ``create_schema()`` creates beside the store's, e.g. the outbox's), :func:`schema_objects`
  and :func:`check_schema` (the plan that checks the schema whole on a store's first use),
  :func:`upgrade_schema` and :data:`UPGRADABLE` (an earlier release's tables brought up to
  date in place, through any ``run(sql)``).
* Change feed (``LISTEN``/``NOTIFY``, shared by both stores): :func:`channel_name`,
  :func:`notify_plan`, :func:`listen_sql`, :func:`listener_name`,
  :func:`listen_conninfo`, :data:`LISTEN_TICK`, :data:`PING_INTERVAL`,
  :data:`RECONNECT_DELAYS`.
* Errors: :func:`translate` (a driver error → ``ConfigurationError`` for a missing schema or
  refused credentials, else ``StoreUnavailableError``), :func:`schema_missing`,
  :data:`SCHEMA_MISSING`.
"""

from __future__ import annotations

from ._dialects import check_schema, dialect_plans, drive, schema_objects
from ._errors import SCHEMA_MISSING, schema_missing, translate
from ._feed import (
    LISTEN_TICK,
    PING_INTERVAL,
    RECONNECT_DELAYS,
    channel_name,
    listen_conninfo,
    listen_sql,
    listener_name,
    notify_plan,
)
from ._plans import (
    COUNT,
    CREATE_ATTEMPTS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_SOCKET_TIMEOUT,
    ROWS,
    CommonPlans,
    Plan,
    PostgresPlans,
    Statement,
    check_options,
    postgres_plans,
)
from ._replication import acheck_synchronous_replication, check_synchronous_replication
from ._schema import (
    DEFAULT_TABLE_PREFIX,
    build_metadata,
    fencing_sequence,
    refuse_mismatch,
    register_schema_extension,
)
from ._sqlite import fencing_table
from ._statements import Common, check_intact, identity, pyformat, record, scope_params
from ._upgrade import UPGRADABLE, upgrade_schema

__all__ = [
    "COUNT",
    "CREATE_ATTEMPTS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_SOCKET_TIMEOUT",
    "DEFAULT_TABLE_PREFIX",
    "LISTEN_TICK",
    "PING_INTERVAL",
    "RECONNECT_DELAYS",
    "ROWS",
    "SCHEMA_MISSING",
    "UPGRADABLE",
    "Common",
    "CommonPlans",
    "Plan",
    "PostgresPlans",
    "Statement",
    "acheck_synchronous_replication",
    "build_metadata",
    "channel_name",
    "check_intact",
    "check_options",
    "check_schema",
    "check_synchronous_replication",
    "dialect_plans",
    "drive",
    "fencing_sequence",
    "fencing_table",
    "identity",
    "listen_conninfo",
    "listen_sql",
    "listener_name",
    "notify_plan",
    "postgres_plans",
    "pyformat",
    "record",
    "refuse_mismatch",
    "register_schema_extension",
    "schema_missing",
    "schema_objects",
    "scope_params",
    "translate",
    "upgrade_schema",
]
