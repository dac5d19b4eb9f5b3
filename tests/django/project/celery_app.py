"""The test project's Celery app (``celery -A tests.django.project.celery_app worker``), the
way a Django project defines one: configured from the Django settings (``CELERY_*``), its
tasks in ``orders/tasks.py``; ``orders.apps`` calls ``setup(app, get_handler())``.

The worker subprocess gets ``DJANGO_SETTINGS_MODULE`` from its environment."""

from __future__ import annotations

from celery import Celery

app = Celery("django_project", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.django.project.orders"])
