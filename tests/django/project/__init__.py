"""A small Django project for the tests: PostgreSQL (``default``) and SQLite (``sqlite``)
databases, the idempotency app, an ``orders`` app whose rows bodies write, and a Celery app
(:mod:`.celery_app`) whose worker subprocesses run the same project."""
