"""The store's three tables as Django models: records, retry counters, maintenance locks.

They describe the tables the app's migrations create (the SQL store's schema, see
:mod:`._schema`), so that Django knows them: ``migrate``, ``flush`` between tests, the admin
and read-only ORM queries (``IdempotencyRecord.objects.filter(status="FAILED")``).  Rows are
written by the handler only: the models refuse ``save()``, ``delete()`` and queryset
``update()``/``delete()``, because a plain ORM write would skip the fencing conditions every
write of the library carries.

Django wants a single-column primary key; the tables' real key is ``(tenant, operation,
key)``.  A record's Django ``pk`` is its fencing token (unique: every attempt draws a new one
from the store-wide sequence); a counter's is its ``key`` column — never look counters up by
``pk``, filter on the three scope columns.

Django builds model classes against its loaded app registry, so the classes are made when
the app's config imports its models (:func:`define`), not when this module is imported: it
imports without configured settings (tools, ``python -OO`` import checks).  After Django has
loaded its apps, ``from idempotent_tasks.django.models import IdempotencyRecord`` works as
usual.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import models

from .._core.records import Status
from ._schema import PREFIX

_READ_ONLY = "idempotency tables are written by the handler only (its writes are fenced)"


class Tables(NamedTuple):
    IdempotencyRecord: Any
    RetryCounter: Any
    MaintenanceLock: Any


_tables: Tables | None = None


def define() -> Tables:
    """Build (once) and register the model classes; Django's app registry must be loading
    or ready (the app config calls this from ``import_models``)."""
    global _tables
    if _tables is None:
        _tables = _build()
    return _tables


def __getattr__(name: str) -> Any:
    if name in Tables._fields:
        return getattr(define(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _ReadOnlyQuerySet(models.QuerySet):  # type: ignore[misc]
    def update(self, **kwargs: Any) -> int:
        raise TypeError(_READ_ONLY)

    def delete(self) -> tuple[int, dict[str, int]]:
        raise TypeError(_READ_ONLY)


def _read_only_base() -> Any:
    class ReadOnly(models.Model):  # type: ignore[misc]
        """Refuses ORM writes (see the module docstring)."""

        objects = _ReadOnlyQuerySet.as_manager()

        class Meta:
            abstract = True

        def save(self, *args: Any, **kwargs: Any) -> None:
            raise TypeError(_READ_ONLY)

        def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
            raise TypeError(_READ_ONLY)

    return ReadOnly


def _build() -> Tables:
    _ReadOnly = _read_only_base()

    class IdempotencyRecord(_ReadOnly):  # type: ignore[misc,valid-type]
        """One scope's record (see docs/design.md for the fields)."""

        tenant = models.TextField()
        operation = models.TextField()
        key = models.TextField()
        status = models.CharField(max_length=16, choices=[(s.value, s.value) for s in Status])
        request_hash = models.TextField()
        response = models.BinaryField(null=True)
        fencing_token = models.BigIntegerField(primary_key=True)
        created_at = models.FloatField()
        updated_at = models.FloatField()
        lease_expires_at = models.FloatField(null=True)
        expires_at = models.FloatField(null=True)

        class Meta:
            app_label = "idempotent_tasks"
            db_table = f"{PREFIX}_records"
            verbose_name = "idempotency record"
            ordering = ("created_at", "tenant", "operation", "key")
            permissions = (
                ("unpoison_idempotencyrecord", "Can unpoison idempotency records"),
                ("resolve_idempotencyrecord", "Can resolve UNCERTAIN idempotency records"),
            )

        def __str__(self) -> str:
            return f"{self.tenant} / {self.operation} / {self.key}"

    class RetryCounter(_ReadOnly):  # type: ignore[misc,valid-type]
        """A scope's retry counter (it outlives the scope's record)."""

        tenant = models.TextField()
        operation = models.TextField()
        key = models.TextField(primary_key=True)
        count = models.IntegerField()
        updated_at = models.FloatField()
        #: The scope's recorded steps (opaque; they go with the counter).
        steps = models.BinaryField(null=True)

        class Meta:
            app_label = "idempotent_tasks"
            db_table = f"{PREFIX}_retry_counters"

    class MaintenanceLock(_ReadOnly):  # type: ignore[misc,valid-type]
        """A named lease of the maintenance jobs (recovery, cleanup)."""

        name = models.TextField(primary_key=True)
        owner = models.TextField()
        expires_at = models.FloatField()

        class Meta:
            app_label = "idempotent_tasks"
            db_table = f"{PREFIX}_locks"

    for cls in (IdempotencyRecord, RetryCounter, MaintenanceLock):
        cls.__qualname__ = cls.__name__
    return Tables(IdempotencyRecord, RetryCounter, MaintenanceLock)


__all__ = ["IdempotencyRecord", "MaintenanceLock", "RetryCounter", "define"]  # noqa: F822
