"""Staging: ``current_outbox().send(...)`` writes one row through the body's own transaction.

What is guaranteed: the row commits together with the body's writes and its SUCCESS record,
or not at all — a body that raises, a worker killed mid-body, or a stale owner whose lease was
taken over (its final conditional update matches no row) rolls its staged rows back with
everything else.  Only the attempt that committed leaves rows, so the relay publishes each
staged message of an operation once per committed run.

Keys: the n-th message a body stages (``position`` n, from 0) gets the idempotency key
``derive_key(tenant, operation, key, "outbox", str(n))`` of the parent scope, and the parent's
tenant.  A re-run of the body (after a rollback) stages the same keys again, so even a message
that a crashed attempt's *sibling* published (none can: its rows were rolled back) would be
deduplicated by the receiver.

Cost: one statement per ``send`` on the open connection.  On PostgreSQL the first ``send``
of a transaction also notifies the relays, in the same statement (``WITH … INSERT …
RETURNING`` + ``pg_notify``); the notification is delivered at commit, and only if the
transaction commits.  The row is written through the raw DBAPI
connection underneath the SQLAlchemy (or Django) connection — the same session, the same
transaction — without SQLAlchemy's per-statement overhead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

from .._core.context import CURRENT_CONTEXT
from .._core.errors import ConfigurationError, IdempotencyError
from .._core.keys import derive_key
from .._core.records import IdempotencyContext
from .._core.transaction_context import OpenTransaction, current_transaction
from ..stores.sql.protocol import DEFAULT_TABLE_PREFIX, translate
from ._metrics import OutboxMetrics, outbox_metrics_for
from ._schema import table_name
from ._targets import (
    KafkaRecord,
    Target,
    as_target,
    celery_task,
    dramatiq_message,
    encode_fields,
    kafka_record,
    rabbitmq_message,
)

_COLUMNS = ("tenant", "operation", "parent_key", "parent_token", "position", "key", "kind",
            "destination", "message", "body", "created_at", "available_at")
_STATE = "outbox"


class StagedMessage(NamedTuple):
    """What ``send`` staged: the message's idempotency key and tenant, its position among the
    body's messages, its kind and destination."""

    key: str
    tenant: str
    position: int
    kind: str
    destination: str


def staged_key(tenant: str, operation: str, key: str, position: int) -> str:
    """The idempotency key of the ``position``-th message staged by the scope's body."""
    return derive_key(tenant, operation, key, "outbox", str(position))


def notify_channel(prefix: str) -> str:
    """The PostgreSQL ``NOTIFY`` channel staging signals on (``LISTEN`` by the relays)."""
    return table_name(prefix)


@cache
def insert_statement(family: str, prefix: str, notify: bool = True) -> str:
    """The staging statement for a database family (``postgresql``, ``sqlite``, ``mysql``)."""
    quote = "`" if family == "mysql" else '"'
    table = f"{quote}{table_name(prefix)}{quote}"
    mark = "?" if family == "sqlite" else "%s"
    columns = ", ".join(f"{quote}{c}{quote}" for c in (*_COLUMNS, "status", "attempts"))
    values = ", ".join([mark] * len(_COLUMNS) + ["'PENDING'", "0"])
    insert = f"INSERT INTO {table} ({columns}) VALUES ({values})"
    if family == "postgresql" and notify:
        channel = notify_channel(prefix).replace("'", "''")
        signal = f"SELECT pg_notify('{channel}', '') FROM staged"
        return f"WITH staged AS ({insert} RETURNING 1) {signal}"
    return insert


def _family(name: str) -> str:
    if name in ("postgresql", "sqlite"):
        return name
    if name in ("mysql", "mariadb"):
        return "mysql"
    raise ConfigurationError(f"the outbox supports PostgreSQL, SQLite and MySQL, not {name!r}")


def _dbapi_of(conn: Any) -> tuple[str, Any]:
    """(database family, DBAPI connection) of a SQLAlchemy or Django connection."""
    dialect = getattr(conn, "dialect", None)
    if dialect is not None and hasattr(conn, "connection"):  # sqlalchemy.Connection
        return _family(dialect.name), conn.connection.dbapi_connection
    vendor = getattr(conn, "vendor", None)
    if isinstance(vendor, str) and hasattr(conn, "ensure_connection"):  # Django
        conn.ensure_connection()
        return _family(vendor), conn.connection
    raise ConfigurationError(
        f"the outbox cannot write through a {type(conn).__name__}: an async body stages with "
        "`await outbox.send_async(...)`"
    )


class TransactionalOutbox:
    """The outbox of the transactional body running here (``current_outbox()``, or the
    ``outbox`` argument of a Celery task, Dramatiq actor or consumer body)."""

    def __init__(self, tx: OpenTransaction, context: IdempotencyContext) -> None:
        self._tx = tx
        self._context = context
        self._prefix: str = tx.table_prefix or DEFAULT_TABLE_PREFIX
        self._metrics: OutboxMetrics = outbox_metrics_for(tx.metrics)
        self._next = 0
        self._cursor: Any = None
        self._family = ""
        self._statements: tuple[str, str] = ("", "")
        self._clock = tx.clock
        self._token = context.fencing_token
        self._parent = (str(context.tenant), context.operation, str(context.key))
        self._parent_hash = derive_key(*self._parent)  # Kafka's default record key
        # staged_key() of this parent is derive_key(*parent, "outbox", str(n)): the hash of
        # the parts' length-prefixed encoding; its constant head is hashed once.
        head = "".join(f"{len(p)}:{p}|" for p in (*self._parent, "outbox"))
        self._key_head = hashlib.sha256(head.encode("utf-8"))

    def _key(self, position: int) -> str:
        digest = self._key_head.copy()
        text = str(position)
        digest.update(f"{len(text)}:{text}".encode())
        return digest.hexdigest()

    # -- staging -------------------------------------------------------------------------------
    def send(self, message: Any) -> StagedMessage:
        """Stage ``message`` (a target, a Celery signature or a Dramatiq message) in the body's
        transaction; it is published by a relay once the transaction commits."""
        if self._cursor is None:
            self._family, dbapi = _dbapi_of(self._tx.connection)
            self._cursor = dbapi.cursor()
            self._statements = (insert_statement(self._family, self._prefix, True),
                                insert_statement(self._family, self._prefix, False))
        staged, params = self._row(as_target(message))
        try:  # the first row of a transaction notifies the relays; one notification is enough
            self._cursor.execute(self._statements[self._next > 0], params)
        except Exception as exc:
            raise self._failure(exc) from exc
        self._next += 1
        self._metrics.staged(staged.kind)
        return staged

    async def send_async(self, message: Any) -> StagedMessage:
        """``send`` for an async body on an ``AsyncSQLStore`` (a ``psycopg.AsyncConnection``
        or an asyncpg connection)."""
        conn = self._tx.connection
        numbered = hasattr(conn, "fetchval")  # asyncpg: ``$n`` placeholders, positional
        if not numbered and (not hasattr(conn, "execute") or not hasattr(conn, "pgconn")):
            return self.send(message)
        staged, params = self._row(as_target(message))
        sql = insert_statement("postgresql", self._prefix, self._next == 0)
        try:
            if numbered:
                parts = sql.split("%s")
                sql = "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], 1)) + parts[-1]
                await conn.execute(sql, *params)
            else:
                await conn.execute(sql, params)
        except Exception as exc:
            raise self._failure(exc) from exc
        self._next += 1
        self._metrics.staged(staged.kind)
        return staged

    def _row(self, target: Target) -> tuple[StagedMessage, tuple[Any, ...]]:
        tenant, operation, parent = self._parent
        position = self._next
        key = self._key(position)
        fields = target.fields()
        if isinstance(target, KafkaRecord):
            body = target.value
            if target.key is None:
                fields["key"] = self._parent_hash  # one parent, one partition: its order
        else:
            body = getattr(target, "body", None)
        now = self._clock()
        params = (tenant, operation, parent, self._token, position, key, target.kind,
                  target.destination, encode_fields(fields), body, now, now)
        return StagedMessage(key, tenant, position, target.kind, target.destination), params

    def _failure(self, exc: BaseException) -> IdempotencyError:
        if isinstance(exc, IdempotencyError):
            return exc
        return translate(self._family or "sql", self._prefix, "outbox send", exc)

    # -- one call per kind: the target's constructor, then send ---------------------------------
    def celery_task(self, name: str, args: Sequence[Any] = (),
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> StagedMessage:
        """Stage ``app.send_task(name, args, kwargs, **options)``."""
        return self.send(celery_task(name, args, kwargs, **options))

    def dramatiq_message(self, actor_name: str, args: Sequence[Any] = (),
                         kwargs: Mapping[str, Any] | None = None, *,
                         queue_name: str = "default", delay: int | None = None,
                         **options: Any) -> StagedMessage:
        """Stage a Dramatiq message for ``actor_name`` on ``queue_name``."""
        return self.send(dramatiq_message(actor_name, args, kwargs, queue_name=queue_name,
                                          delay=delay, **options))

    def kafka_record(self, topic: str, value: Any, *, key: bytes | str | None = None,
                     headers: Mapping[str, bytes | str] | None = None,
                     partition: int | None = None) -> StagedMessage:
        """Stage a Kafka record."""
        return self.send(kafka_record(topic, value, key=key, headers=headers,
                                      partition=partition))

    def rabbitmq_message(self, body: Any, *, routing_key: str, exchange: str = "",
                         headers: Mapping[str, Any] | None = None,
                         content_type: str | None = None, **properties: Any) -> StagedMessage:
        """Stage a RabbitMQ publish."""
        return self.send(rabbitmq_message(body, routing_key=routing_key, exchange=exchange,
                                          headers=headers, content_type=content_type,
                                          **properties))


def current_outbox() -> TransactionalOutbox:
    """The outbox of the transactional body running in this thread / task.

    Raises :class:`~idempotent_tasks.ConfigurationError` outside a keyed transactional body
    (``transactional=True`` / ``execute_in_transaction``): anywhere else a staged message
    could not commit with the body's effects.
    """
    tx = current_transaction()
    if tx is None or tx.context is None or tx.context.key is None:
        raise ConfigurationError(
            "current_outbox() is available only inside a keyed transactional body "
            "(transactional=True, or handler.execute_in_transaction)"
        )
    if CURRENT_CONTEXT.get() is not tx.context:
        raise ConfigurationError(
            "current_outbox() inside a nested, non-transactional body: its messages could not "
            "commit with that body"
        )
    outbox: TransactionalOutbox | None = tx.state.get(_STATE)
    if outbox is None:
        outbox = tx.state[_STATE] = TransactionalOutbox(tx, tx.context)
    return outbox


__all__ = [
    "StagedMessage",
    "TransactionalOutbox",
    "current_outbox",
    "insert_statement",
    "notify_channel",
    "staged_key",
]
