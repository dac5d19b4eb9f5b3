"""``idempotency_migrate``, ``idempotency_recover``, ``idempotency_cleanup``,
``idempotency_inspect`` and ``idempotency_unpoison``."""
