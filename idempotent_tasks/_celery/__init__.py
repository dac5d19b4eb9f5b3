"""Celery glue; the public names live in :mod:`idempotent_tasks.celery`."""
