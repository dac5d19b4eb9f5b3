"""The Django app: ``INSTALLED_APPS += ["idempotent_tasks.django"]`` (label
``idempotent_tasks``).

Loading it builds the models (see :mod:`.models`), and ``ready()`` wires the rest on Django's
own extension points: the admin pages (when ``django.contrib.admin`` is installed), the
system checks, ``enqueue_once`` publishing on ``transaction.on_commit``, and a fresh
``get_handler()`` when tests change ``IDEMPOTENT_TASKS`` with ``override_settings``.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig, apps


class IdempotentTasksConfig(AppConfig):  # type: ignore[misc]
    name = "idempotent_tasks.django"
    label = "idempotent_tasks"
    verbose_name = "Idempotency"
    default = True

    def import_models(self) -> None:
        super().import_models()
        from . import models

        models.define()

    def ready(self) -> None:
        from django.core import checks
        from django.core.signals import setting_changed

        from .. import enqueue
        from . import _checks, _enqueue

        checks.register(_checks.check_configuration, "idempotent_tasks")
        enqueue.set_publish_deferrer(_enqueue.on_commit_deferrer)
        setting_changed.connect(_forget_handler, dispatch_uid="idempotent_tasks_settings")
        if apps.is_installed("django.contrib.admin"):
            from django.contrib import admin

            from .admin import register

            register(admin.site)


def _forget_handler(setting: str, **kwargs: Any) -> None:
    if setting == "IDEMPOTENT_TASKS":
        from . import _settings

        _settings.forget_handler()
