"""The shop's settings.  ``SHOP_DB=postgres`` uses the README's PostgreSQL (``test``
database on 127.0.0.1), otherwise a SQLite file next to manage.py; ``SHOP_EAGER=1`` runs
Celery tasks in-process (no broker needed)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "django-shop-example-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "idempotent_tasks.django",
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "idempotent_tasks.django.IdempotencyMiddleware",  # after AuthenticationMiddleware
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"

if os.environ.get("SHOP_DB") == "postgres":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": os.environ.get("SHOP_PG_NAME", "test"),
        "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432",
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_SQLITE", str(BASE_DIR / "shop.sqlite3")),
    }}

IDEMPOTENT_TASKS = {
    "DATABASE": "default",
    "TTL": 86_400,
    "LEASE_TIMEOUT": 60,
    "MAX_RETRIES": 3,
    "HTTP": {
        "GET_TENANT": "orders.views.customer_of",
        "ROUTES": [("POST", "/orders/{id}")],
        "PROFILE": "guide",
    },
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_TASK_ALWAYS_EAGER = os.environ.get("SHOP_EAGER") == "1"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SHOP_QUEUE", "celery")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_TIME_LIMIT = 50  # below LEASE_TIMEOUT: a stuck body is killed before its lease ends
