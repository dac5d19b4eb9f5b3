from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "tests.django.project.orders"
    label = "orders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # What docs/django.md shows: the Celery app gets the settings' handler once Django
        # is ready (in the web process and in every worker).
        from idempotent_tasks.celery import setup
        from idempotent_tasks.django import get_handler

        from ..celery_app import app

        setup(app, get_handler(), beat=False)
