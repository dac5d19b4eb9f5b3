"""Recorded steps and the UNCERTAIN status: the retry counters gain a nullable ``steps``
column (a scope's recorded steps live on its counter row), the records' status check admits
``'UNCERTAIN'``, and the record model gains the ``resolve_idempotencyrecord`` permission (the
admin's Resolve actions).

The database side is :func:`~idempotent_tasks.django._schema.upgrade_schema`, the same
in-place upgrade ``SQLStore.create_schema()`` runs (a no-op on tables ``0001_initial`` made
by this release); on SQLite, which cannot alter a constraint, the records table is rebuilt
with its rows, indexes and token triggers.  Nothing is undone backwards: the column and the
wider check serve the previous release as they are.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models

from .._schema import upgrade_schema

_STATUSES = [(s, s) for s in ("PROCESSING", "SUCCESS", "FAILED", "UNCERTAIN")]


def _forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_schema(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[tuple[str, str]]] = [
        ("idempotent_tasks", "0003_alter_idempotencyrecord_options")
    ]
    operations: ClassVar[list[Any]] = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(_forwards, migrations.RunPython.noop)],
            state_operations=[
                migrations.AlterField(
                    model_name="idempotencyrecord",
                    name="status",
                    field=models.CharField(choices=_STATUSES, max_length=16),
                ),
                migrations.AddField(
                    model_name="retrycounter",
                    name="steps",
                    field=models.BinaryField(null=True),
                ),
                migrations.AlterModelOptions(
                    name="idempotencyrecord",
                    options={
                        "ordering": ("created_at", "tenant", "operation", "key"),
                        "permissions": (
                            ("unpoison_idempotencyrecord", "Can unpoison idempotency records"),
                            ("resolve_idempotencyrecord",
                             "Can resolve UNCERTAIN idempotency records"),
                        ),
                        "verbose_name": "idempotency record",
                    },
                ),
            ],
        ),
    ]
