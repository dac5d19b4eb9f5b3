"""The ``idempotent-tasks`` command line, split by concern: ``app`` (group, store, errors,
exit codes), ``maintenance`` (migrate/recover/cleanup), ``records`` (inspect/list/stats/
unpoison) and ``demo``.  The public entry point is :mod:`idempotent_tasks.cli`."""
