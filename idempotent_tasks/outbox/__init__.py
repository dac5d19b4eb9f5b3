"""The transactional outbox: follow-up messages that commit with the body's effects.

* Guarantee: inside a transactional body (``transactional=True``,
  ``handler.execute_in_transaction``), ``current_outbox().send(...)`` — or the ``outbox``
  argument a Celery task, Dramatiq actor or consumer body declares — stages a Celery task,
  a Dramatiq message, a Kafka record or a RabbitMQ publish as a row of ``<prefix>_outbox``
  **in the body's own transaction**: it exists if and only if the body's writes and its
  SUCCESS committed.  A relay (:class:`OutboxRelay`: a thread in workers, a Celery beat entry,
  or ``idempotent-tasks relay``) publishes the rows, in order per parent scope, at least once,
  each with the idempotency key ``derive_key(tenant, operation, key, "outbox", position)`` and
  the parent's tenant; the receiver's own idempotency turns the relay's redeliveries into one
  execution: exactly-once processing, end to end, on at-least-once brokers.
* Atomic primitive: the body's transaction (docs/transactional.md); the
  relay's marks are conditional updates on the row's status.
* TTL: rows are kept until published, then ``ttl`` (the handler's by default); a row that
  cannot be published is retried with backoff, then POISONED and kept for the operator
  (``idempotent-tasks outbox list|retry|drop``).
* Databases: PostgreSQL (with ``LISTEN/NOTIFY`` wake-up), SQLite, MySQL/MariaDB — the
  databases of ``SQLStore``; SQLAlchemy and Django transactions; ``send_async`` on an
  ``AsyncSQLStore``.

docs/outbox.md is the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._arguments import outbox_kwargs
from ._schema import RowStatus, ddl, outbox_table, sent_table_name, table_name
from ._staging import StagedMessage, TransactionalOutbox, current_outbox, staged_key
from ._table import Outbox, OutboxRow
from ._targets import (
    CeleryTask,
    DramatiqMessage,
    KafkaRecord,
    RabbitMQMessage,
    Target,
    as_target,
    celery_task,
    dramatiq_message,
    kafka_record,
    rabbitmq_message,
)
from .publishers import Publisher, PublishResult
from .relay import BatchReport, OutboxRelay

if TYPE_CHECKING:
    from .publishers import CeleryPublisher, DramatiqPublisher, KafkaPublisher, RabbitMQPublisher

_PUBLISHERS = ("CeleryPublisher", "DramatiqPublisher", "KafkaPublisher", "RabbitMQPublisher")


def __getattr__(name: str) -> Any:
    if name in _PUBLISHERS:
        from . import publishers

        value = getattr(publishers, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchReport",
    "CeleryPublisher",
    "CeleryTask",
    "DramatiqMessage",
    "DramatiqPublisher",
    "KafkaPublisher",
    "KafkaRecord",
    "Outbox",
    "OutboxRelay",
    "OutboxRow",
    "PublishResult",
    "Publisher",
    "RabbitMQMessage",
    "RabbitMQPublisher",
    "RowStatus",
    "StagedMessage",
    "Target",
    "TransactionalOutbox",
    "as_target",
    "celery_task",
    "current_outbox",
    "ddl",
    "dramatiq_message",
    "kafka_record",
    "outbox_kwargs",
    "outbox_table",
    "rabbitmq_message",
    "sent_table_name",
    "staged_key",
    "table_name",
]
