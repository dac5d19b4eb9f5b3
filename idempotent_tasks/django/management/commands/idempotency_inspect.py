"""``manage.py idempotency_inspect TENANT OPERATION KEY [--json]``: one scope's record,
retry counter, result, lease and timestamps (exit 3 when it has no live record)."""

from __future__ import annotations

from typing import Any

from ....cli._render import record_document, record_table
from ..._commands import HandlerCommand, add_scope_arguments, load_record


class Command(HandlerCommand):
    help = "Show one scope's idempotency record (exit 3 when there is none)."

    def add_arguments(self, parser: Any) -> None:
        add_scope_arguments(parser)
        self.add_json_flag(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = self.handler()
        record = load_record(handler, options["tenant"], options["operation"], options["key"])
        now = handler.clock()
        doc = record_document(record, now)
        if options["as_json"]:
            self.emit_json(doc)
        else:
            self.emit_table(record_table(doc, now, f"{record.status.value} record"))
