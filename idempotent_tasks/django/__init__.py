"""Django: the app, ``DjangoStore`` on Django's own connection, the middleware, the admin.

* ``INSTALLED_APPS += ["idempotent_tasks.django"]`` (label ``idempotent_tasks``); ``python
  manage.py migrate`` creates the store's tables — the SQL store's schema, so
  ``idempotent-tasks --store <url> …`` works on them, and a database where ``SQLStore``
  already created them is adopted with its records.
* ``IDEMPOTENT_TASKS = {...}`` in ``settings.py`` (see :mod:`._settings`); :func:`get_handler`
  is the process's handler, on :class:`DjangoStore` (``DATABASE``, default ``"default"``).
* ``transactional=True`` tasks, actors and consumers and ``handler.execute_in_transaction``
  run ``fn(connection)`` inside ``transaction.atomic(using=…)``: the body's **ORM** writes and
  the SUCCESS record commit together, exactly once (docs/django.md).
* :class:`IdempotencyMiddleware` (sync and async) protects views with the ``Idempotency-Key``
  rules of ``idempotent_tasks.http`` and sets ``request.idempotency``;
  :func:`idempotent_view` / :func:`idempotency_exempt` decide per view.
* ``manage.py idempotency_migrate | idempotency_recover | idempotency_cleanup |
  idempotency_inspect | idempotency_unpoison``; a read-only admin with an audited unpoison
  action; system checks for risky settings; ``enqueue_once`` publishing on
  ``transaction.on_commit`` inside a transaction.

Needs ``pip install 'idempotent-tasks[django]'`` (Django 4.2 or later).
"""

from __future__ import annotations

try:
    import django  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "idempotent_tasks.django needs Django: pip install 'idempotent-tasks[django]'"
    ) from exc

from ._middleware import IdempotencyMiddleware
from ._settings import get_handler
from ._store import DjangoStore
from ._views import idempotency_exempt, idempotent_view

__all__ = [
    "DjangoStore",
    "IdempotencyMiddleware",
    "get_handler",
    "idempotency_exempt",
    "idempotent_view",
]
