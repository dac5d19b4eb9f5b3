"""``manage.py idempotency_migrate``: create the store's schema.

On the app's own store (``DjangoStore`` on ``IDEMPOTENT_TASKS["DATABASE"]``) this is ``manage.py
migrate idempotent_tasks --database <alias>``; with ``IDEMPOTENT_TASKS["HANDLER"]`` (another
store: Redis, a ``SQLStore`` elsewhere) it runs that handler's ``create_schema()``, as
``idempotent-tasks migrate`` would.  Safe on every deploy.
"""

from __future__ import annotations

from typing import Any

from django.core.management import call_command

from ... import _settings
from ..._commands import HandlerCommand


class Command(HandlerCommand):
    help = "Create the idempotency store's tables (the app's migrations) or scripts."

    def handle(self, *args: Any, **options: Any) -> None:
        if "HANDLER" in _settings.raw_settings():
            self.handler().create_schema()
            self.stdout.write("schema ready (IDEMPOTENT_TASKS['HANDLER'])")
            return
        alias = _settings.database_alias()
        call_command(
            "migrate", "idempotent_tasks", database=alias, verbosity=options["verbosity"],
            stdout=self.stdout, stderr=self.stderr,
        )
        self.stdout.write(f"schema ready: database {alias!r}")
