"""``manage.py idempotency_recover [--timeout S] [--limit N] [--all] [--dry-run] [--json]``:
unblock scopes whose worker crashed (PROCESSING with an expired lease), exactly as the
workers' own maintenance does: each crashed attempt is counted, then the scope is released
for redelivery or poisoned (``MAX_RETRIES``, ``ON_STUCK`` and per-task options apply).
``--dry-run`` only reads."""

from __future__ import annotations

from typing import Any

from ....cli._maintenance import _batches, _stuck_plan
from ....cli._render import records_table
from ..._commands import HandlerCommand


class Command(HandlerCommand):
    help = "Recover idempotency records whose worker crashed (expired leases)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                            help="Only records whose last heartbeat is also older than this.")
        parser.add_argument("--limit", type=int, default=100, help="Records per batch.")
        parser.add_argument("--all", action="store_true", dest="repeat",
                            help="Repeat batches until none is full.")
        parser.add_argument("--dry-run", action="store_true",
                            help="List what would be recovered; change nothing.")
        self.add_json_flag(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = self.handler()
        timeout, limit = options["timeout"], max(1, options["limit"])
        if options["dry_run"]:
            stuck = handler.find_stuck_records(timeout=timeout, limit=limit)
            now = handler.clock()
            plan = _stuck_plan(handler, stuck, now)
            if options["as_json"]:
                self.emit_json({"dry_run": True, "would_recover": len(plan), "records": plan})
                return
            if plan:
                title = f"{len(plan)} stuck record(s)"
                self.emit_table(records_table(plan, now, title, extra=("action",)))
            self.stdout.write(f"dry run: would recover {len(plan)} record(s); nothing was changed")
            return
        total, batches = _batches(
            lambda: handler.recover_stuck_records(timeout=timeout, limit=limit), limit,
            options["repeat"], "recovering stuck records",
        )
        if options["as_json"]:
            self.emit_json({"recovered": total, "batches": batches})
        else:
            self.stdout.write(f"recovered {total} stuck record(s) in {batches} batch(es)")
