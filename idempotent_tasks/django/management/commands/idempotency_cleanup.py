"""``manage.py idempotency_cleanup [--limit N] [--all] [--dry-run] [--json]``: purge expired
SUCCESS/FAILED records (their keys become reusable) and stale retry counters, as the workers'
own maintenance does (the settings' ``TTL`` keeps counters of record-less scopes).
``--dry-run`` only reads."""

from __future__ import annotations

from typing import Any

from ....cli._maintenance import _batches, _expired_preview
from ....cli._render import listed_document, records_table
from ..._commands import HandlerCommand


class Command(HandlerCommand):
    help = "Purge expired idempotency records and stale retry counters."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--limit", type=int, default=500, help="Records per batch.")
        parser.add_argument("--all", action="store_true", dest="repeat",
                            help="Repeat batches until none is full.")
        parser.add_argument("--dry-run", action="store_true",
                            help="List what would be purged; change nothing.")
        self.add_json_flag(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = self.handler()
        limit = max(1, options["limit"])
        if options["dry_run"]:
            now, expired = _expired_preview(handler, limit)
            docs = [listed_document(r, now) for r in expired]
            for doc in docs:
                del doc["retry_count"]  # a purge never depends on it
            if options["as_json"]:
                self.emit_json({"dry_run": True, "would_purge": len(docs), "records": docs})
                return
            if docs:
                self.emit_table(records_table(docs, now, f"{len(docs)} expired record(s)"))
            self.stdout.write(
                f"dry run: would purge {len(docs)} record(s) (stale retry counters are not "
                "previewed); nothing was changed"
            )
            return
        total, batches = _batches(
            lambda: handler.cleanup_expired_records(limit=limit), limit, options["repeat"],
            "purging expired records",
        )
        if options["as_json"]:
            self.emit_json({"purged": total, "batches": batches})
        else:
            self.stdout.write(f"purged {total} expired record(s) in {batches} batch(es)")
