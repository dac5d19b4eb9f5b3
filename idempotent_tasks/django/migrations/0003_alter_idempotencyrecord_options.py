"""State only: the record model's ``permissions`` as the model declares them (a tuple).

``0001_initial`` wrote them as a list, so Django's autodetector saw a change on every
``migrate`` ("Your models in app(s): 'idempotent_tasks' have changes …") and
``makemigrations`` would have written this file into the installed library.  Nothing
changes in the database.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: ClassVar[list[tuple[str, str]]] = [("idempotent_tasks", "0002_outbox")]
    operations: ClassVar[list[Any]] = [
        migrations.AlterModelOptions(
            name="idempotencyrecord",
            options={
                "ordering": ("created_at", "tenant", "operation", "key"),
                "permissions": (
                    ("unpoison_idempotencyrecord", "Can unpoison idempotency records"),
                ),
                "verbose_name": "idempotency record",
            },
        ),
    ]
