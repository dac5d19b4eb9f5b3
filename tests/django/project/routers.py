"""Sends the ``orders`` and ``idempotent_tasks`` models to the idempotency ``DATABASE``, so
that a test switching it between PostgreSQL and SQLite moves the bodies' ORM writes too."""

from __future__ import annotations

from typing import Any

from django.conf import settings

_APPS = {"orders", "idempotent_tasks"}


class IdempotencyDatabase:
    def _alias(self, model: Any) -> str | None:
        if model._meta.app_label in _APPS:
            chosen = getattr(settings, "ORDERS_DATABASE", None)  # tests that use HANDLER
            return str(chosen or settings.IDEMPOTENT_TASKS.get("DATABASE", "default"))
        return None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)
