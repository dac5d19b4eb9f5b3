"""``manage.py idempotency_inspect TENANT OPERATION KEY [--json]``: one scope's record,
retry counter, result, lease and timestamps, and its past attempts (exit 3 when it has no
live record)."""

from __future__ import annotations

from typing import Any

from ....cli._render import inspected_document, inspected_tables
from ..._commands import HandlerCommand, add_scope_arguments, load_record


class Command(HandlerCommand):
    help = "Show one scope's idempotency record (exit 3 when there is none)."

    def add_arguments(self, parser: Any) -> None:
        add_scope_arguments(parser)
        self.add_json_flag(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = self.handler()
        record = load_record(handler, options["tenant"], options["operation"], options["key"])
        attempts = handler.get_attempts(
            operation=options["operation"], tenant=options["tenant"], key=options["key"]
        )
        now = handler.clock()
        doc = inspected_document(record, attempts, now)
        if options["as_json"]:
            self.emit_json(doc)
            return
        for table in inspected_tables(doc, now):
            self.emit_table(table)
