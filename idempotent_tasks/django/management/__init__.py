"""The app's management commands (``manage.py idempotency_*``)."""
