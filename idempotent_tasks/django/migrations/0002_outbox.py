"""The transactional outbox's tables, ``idempotency_outbox`` and ``idempotency_outbox_sent``
(docs/outbox.md).

The same DDL ``SQLStore.create_schema()`` runs (``idempotent_tasks.outbox.ddl``), with
``IF NOT EXISTS``: a database on which ``SQLStore`` already created the tables is adopted as
they are.  No Django model: the outbox is written through the body's connection by
``current_outbox().send(...)`` and read by the relay (``idempotent-tasks relay``), never by
the ORM, so only the database side exists.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from ...outbox import ddl, sent_table_name, table_name
from .._schema import PREFIX


def _forwards(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        for statement in ddl(schema_editor.connection.vendor, PREFIX, if_not_exists=True):
            cursor.execute(statement)


def _backwards(apps: Any, schema_editor: Any) -> None:
    quote = schema_editor.connection.ops.quote_name
    with schema_editor.connection.cursor() as cursor:
        for name in (table_name(PREFIX), sent_table_name(PREFIX)):
            cursor.execute(f"DROP TABLE IF EXISTS {quote(name)}")


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[tuple[str, str]]] = [("idempotent_tasks", "0001_initial")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(_forwards, _backwards)]
