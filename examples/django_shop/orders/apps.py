from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Once Django is ready (web process and every worker): the Celery app gets the
        # handler built from settings.IDEMPOTENT_TASKS, on Django's own database.
        from shop.celery import app

        from idempotent_tasks.celery import setup
        from idempotent_tasks.django import get_handler

        setup(app, get_handler())
