"""The store's tables, sequence (PostgreSQL) or fencing row and triggers (SQLite).

The database side is :func:`~idempotent_tasks.django._schema.create_schema`: the SQL store's
own DDL, adopting tables ``SQLStore.create_schema()`` already created (records kept).  The
state side tells Django about the three models.  ``migrate`` and ``migrate --fake-initial``
do the same on such a database: Django never fakes this migration (its database side is not
a plain ``CreateModel``), and running it adopts the existing tables.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models

from .._schema import create_schema, drop_schema


def _forwards(apps: Any, schema_editor: Any) -> None:
    create_schema(schema_editor.connection)


def _backwards(apps: Any, schema_editor: Any) -> None:
    drop_schema(schema_editor.connection)


_STATUSES = [("PROCESSING", "PROCESSING"), ("SUCCESS", "SUCCESS"), ("FAILED", "FAILED")]

_MODELS = [
    migrations.CreateModel(
        name="IdempotencyRecord",
        fields=[
            ("tenant", models.TextField()),
            ("operation", models.TextField()),
            ("key", models.TextField()),
            ("status", models.CharField(choices=_STATUSES, max_length=16)),
            ("request_hash", models.TextField()),
            ("response", models.BinaryField(null=True)),
            ("fencing_token", models.BigIntegerField(primary_key=True, serialize=False)),
            ("created_at", models.FloatField()),
            ("updated_at", models.FloatField()),
            ("lease_expires_at", models.FloatField(null=True)),
            ("expires_at", models.FloatField(null=True)),
        ],
        options={
            "verbose_name": "idempotency record",
            "db_table": "idempotency_records",
            "ordering": ("created_at", "tenant", "operation", "key"),
            "permissions": [("unpoison_idempotencyrecord", "Can unpoison idempotency records")],
            "abstract": False,
        },
    ),
    migrations.CreateModel(
        name="RetryCounter",
        fields=[
            ("tenant", models.TextField()),
            ("operation", models.TextField()),
            ("key", models.TextField(primary_key=True, serialize=False)),
            ("count", models.IntegerField()),
            ("updated_at", models.FloatField()),
        ],
        options={"db_table": "idempotency_retry_counters", "abstract": False},
    ),
    migrations.CreateModel(
        name="MaintenanceLock",
        fields=[
            ("name", models.TextField(primary_key=True, serialize=False)),
            ("owner", models.TextField()),
            ("expires_at", models.FloatField()),
        ],
        options={"db_table": "idempotency_locks", "abstract": False},
    ),
]


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(_forwards, _backwards)],
            state_operations=_MODELS,
        ),
    ]
