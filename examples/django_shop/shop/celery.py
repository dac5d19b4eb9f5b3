"""The shop's Celery app: ``celery -A shop worker -l INFO``.

Configured from the Django settings (``CELERY_*``); ``orders.apps`` attaches the idempotency
handler (``setup(app, get_handler())``) once Django is ready, in the web process and in every
worker.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
