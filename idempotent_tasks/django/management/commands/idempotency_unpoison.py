"""``manage.py idempotency_unpoison TENANT OPERATION KEY [--yes] [--actor WHO] [--json]``:
delete a FAILED record and reset its retry counter, so that the next delivery runs the body
again.  Audited like ``idempotent-tasks unpoison`` (the ``unpoisoned`` log entry, actor
``manage.py:<who>``); only FAILED records qualify (exit 3 otherwise)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ...._core.errors import ErrorCode, IdempotencyError
from ...._core.records import Status
from ....cli._app import EXIT_FAILURE
from ....cli._render import record_document, record_table
from ..._commands import HandlerCommand, add_scope_arguments, default_actor, load_record


class Command(HandlerCommand):
    help = "Unpoison a FAILED idempotency record (delete it and reset its counter; audited)."

    def add_arguments(self, parser: Any) -> None:
        add_scope_arguments(parser)
        parser.add_argument("--yes", "-y", "--noinput", "--no-input", action="store_true",
                            dest="yes", help="Do not ask for confirmation (scripts).")
        parser.add_argument("--actor", default=None,
                            help="Who does this, for the audit entry [$USER].")
        self.add_json_flag(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = self.handler()
        tenant, operation, key = options["tenant"], options["operation"], options["key"]
        current = load_record(handler, tenant, operation, key)
        if current.status is not Status.FAILED:
            raise IdempotencyError(
                f"the scope is {current.status.value}, not FAILED: there is nothing to unpoison",
                code=ErrorCode.RECORD_NOT_FOUND,
            )
        if not options["yes"]:
            now = handler.clock()
            self.emit_table(record_table(record_document(current, now), now, "record to unpoison"))
            answer = input("Delete this FAILED record and reset its retry counter? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("aborted", returncode=EXIT_FAILURE)
        actor = f"manage.py:{options['actor'] or default_actor()}"
        old = handler.unpoison(operation=operation, tenant=tenant, key=key, actor=actor)
        now = handler.clock()
        if options["as_json"]:
            self.emit_json({"unpoisoned": True, "actor": actor, "old": record_document(old, now)})
            return
        self.emit_table(record_table(record_document(old, now), now, "old state (deleted)"))
        self.stdout.write(
            f"unpoisoned by {actor}: record deleted, retry counter reset from "
            f"{old.retry_count} to 0; the next delivery runs the body again"
        )
