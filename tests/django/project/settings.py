"""Settings of the test project (also what the Celery worker subprocesses load).

The databases are the session's own: pytest-django creates ``test_<NAME>`` on the machine's
PostgreSQL and a test SQLite file, and drops both at the end.  A worker subprocess is pointed
at those very databases by ``IDEM_DJANGO_PG_NAME`` / ``IDEM_DJANGO_SQLITE`` (already the
test names then).
"""

from __future__ import annotations

import os
import tempfile
import uuid

_RUN = uuid.uuid4().hex[:10]

SECRET_KEY = "idempotent-tasks-tests"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.django.project.urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "idempotent_tasks.django",
    "tests.django.project.orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "idempotent_tasks.django.IdempotencyMiddleware",
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
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("IDEM_DJANGO_PG_NAME", f"idem_django_{_RUN}"),
        "USER": os.environ.get("IDEM_DJANGO_PG_USER", "postgres"),
        "HOST": os.environ.get("IDEM_DJANGO_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("IDEM_DJANGO_PG_PORT", "5432"),
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(
            "IDEM_DJANGO_SQLITE", os.path.join(tempfile.gettempdir(), f"idem_django_{_RUN}.db")
        ),
        "TEST": {"NAME": os.path.join(tempfile.gettempdir(), f"test_idem_django_{_RUN}.db")},
    },
}
DATABASE_ROUTERS = ["tests.django.project.routers.IdempotencyDatabase"]

IDEMPOTENT_TASKS = {
    "DATABASE": os.environ.get("IDEM_DJANGO_DATABASE", "default"),
    "LEASE_TIMEOUT": float(os.environ.get("IDEM_DJANGO_LEASE", "300")),
    "HTTP": {
        "GET_TENANT": "tests.django.project.views.tenant_of",
        "ROUTES": [("POST", "/orders/{id}"), ("POST", "/exempt/{id}"), ("POST", "/async/{id}"),
                   ("POST", "/stream"), ("POST", "/crash"), ("POST", "/ping")],
    },
}

CELERY_BROKER_URL = os.environ.get("IDEM_DJANGO_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("IDEM_DJANGO_QUEUE", f"django_{_RUN}")
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
