"""Private building blocks of :mod:`idempotent_tasks.http` (routes, capture, ASGI, WSGI)."""
