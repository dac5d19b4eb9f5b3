"""``migrate``, ``recover`` and ``cleanup``: the commands that schedulers run.

``recover`` and ``cleanup`` do exactly what the workers' built-in maintenance does
(``handler.recover_stuck_records`` / ``cleanup_expired_records``), so running them from
cron next to workers is safe: every change is a conditional store write.  Their dry runs
only read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .._core.engine import DEFAULT_MAX_RETRIES, DEFAULT_TTL
from .._core.handler import IdempotencyHandler
from .._core.records import Record, Status
from ._app import CliState, make_console, pass_state
from ._render import echo_json, listed_document, records_table

_CLEANUP_SCAN_PAGE = 500


@click.command()
@pass_state
def migrate(state: CliState) -> None:
    """Create the store's tables (or scripts) if missing; safe to run on every deploy.

    Refuses (exit 5) a table of the same name whose columns do not match.  The only command
    that creates a SQLite file that does not exist yet.
    """
    state.may_create = True
    state.handler().create_schema()
    prefix = f" (prefix {state.prefix!r})" if state.prefix else ""
    click.echo(f"schema ready: {state.store().name} at {state.display_url}{prefix}")


def _batches(
    job: Callable[[], int], limit: int, repeat: bool, label: str
) -> tuple[int, int]:
    """Run ``job`` once, or (``repeat``) until a batch handles fewer than ``limit`` records,
    with a progress display on stderr.  Returns (records handled, batches run)."""
    total = batches = 0
    console = make_console(stderr=True)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
        TextColumn("{task.completed}"), TimeElapsedColumn(),
        console=console, transient=True, disable=not repeat,
    ) as progress:
        task = progress.add_task(label, total=None)
        while True:
            done = job()
            total += done
            batches += 1
            progress.update(task, completed=total)
            if not repeat or done < limit:
                return total, batches


def _stuck_plan(
    handler: IdempotencyHandler, stuck: list[Record], now: float
) -> list[dict[str, Any]]:
    """What recovery would do to each stuck record: count it, then release or poison."""
    plan = []
    for record in stuck:
        opts = handler.options_for(record.operation)
        count = record.retry_count
        doc = listed_document(record, now)
        if opts.on_stuck == "fail":
            doc["action"] = "poison (on_stuck=fail)"
        elif count + 1 >= opts.max_retries:
            doc["action"] = f"poison (attempt {count + 1}/{opts.max_retries})"
        else:
            doc["action"] = f"release for redelivery (attempt {count + 1}/{opts.max_retries})"
        plan.append(doc)
    return plan


@click.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Only records whose last heartbeat is also older than this.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Records per batch.")
@click.option("--all", "repeat", is_flag=True, help="Repeat batches until none is full.")
@click.option("--dry-run", is_flag=True, help="List what would be recovered; change nothing.")
@click.option("--on-stuck", type=click.Choice(["retry", "fail"]), default="retry",
              show_default=True, help="Must match the workers' setting.")
@click.option("--max-retries", type=click.IntRange(min=1), default=DEFAULT_MAX_RETRIES,
              show_default=True, help="Must match the workers' setting.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def recover(
    state: CliState,
    timeout: float | None,
    limit: int,
    repeat: bool,
    dry_run: bool,
    on_stuck: str,
    max_retries: int,
    as_json: bool,
) -> None:
    """Unblock scopes whose worker crashed (PROCESSING with an expired lease).

    Each crashed attempt is counted; the scope is released for redelivery, or poisoned once
    the counter reaches --max-retries (or at once with --on-stuck fail).
    """
    handler = state.handler(max_retries=max_retries, on_stuck=on_stuck)
    if dry_run:
        stuck = handler.find_stuck_records(timeout=timeout, limit=limit)
        now = handler.clock()
        plan = _stuck_plan(handler, stuck, now)
        if as_json:
            echo_json({"dry_run": True, "would_recover": len(plan), "records": plan})
            return
        console = make_console()
        if plan:
            console.print(
                records_table(plan, now, f"{len(plan)} stuck record(s)", extra=("action",))
            )
        click.echo(f"dry run: would recover {len(plan)} record(s); nothing was changed")
        return
    total, batches = _batches(
        lambda: handler.recover_stuck_records(timeout=timeout, limit=limit), limit, repeat,
        "recovering stuck records",
    )
    if as_json:
        echo_json({"recovered": total, "batches": batches})
    else:
        click.echo(f"recovered {total} stuck record(s) in {batches} batch(es)")


def _expired_preview(handler: IdempotencyHandler, limit: int) -> tuple[float, list[Record]]:
    """Expired SUCCESS/FAILED records, up to ``limit``, found by scanning pages of
    ``list_records`` (the store has no read-only "find expired" primitive)."""
    now = handler.clock()
    found: list[Record] = []
    for status in (Status.SUCCESS, Status.FAILED):
        offset = 0
        while len(found) < limit:
            page = handler.list_records(status=status, limit=_CLEANUP_SCAN_PAGE, offset=offset)
            found.extend(r for r in page if r.expires_at is not None and r.expires_at <= now)
            if len(page) < _CLEANUP_SCAN_PAGE:
                break
            offset += len(page)
    return now, found[:limit]


@click.command()
@click.option("--limit", type=click.IntRange(min=1), default=500, show_default=True,
              help="Records per batch.")
@click.option("--all", "repeat", is_flag=True, help="Repeat batches until none is full.")
@click.option("--dry-run", is_flag=True, help="List what would be purged; change nothing.")
@click.option("--ttl", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TTL,
              show_default=True, metavar="SECONDS",
              help="Keep retry counters of record-less scopes this long (the workers' ttl).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def cleanup(
    state: CliState, limit: int, repeat: bool, dry_run: bool, ttl: float, as_json: bool
) -> None:
    """Purge expired SUCCESS/FAILED records (their keys become reusable) and stale retry
    counters."""
    handler = state.handler(ttl=ttl)
    if dry_run:
        now, expired = _expired_preview(handler, limit)
        docs = [listed_document(r, now) for r in expired]
        for doc in docs:
            del doc["retry_count"]  # a purge never depends on it
        if as_json:
            echo_json({"dry_run": True, "would_purge": len(docs), "records": docs})
            return
        if docs:
            make_console().print(records_table(docs, now, f"{len(docs)} expired record(s)"))
        click.echo(
            f"dry run: would purge {len(docs)} record(s) (stale retry counters are not "
            "previewed); nothing was changed"
        )
        return
    total, batches = _batches(
        lambda: handler.cleanup_expired_records(limit=limit), limit, repeat,
        "purging expired records",
    )
    if as_json:
        echo_json({"purged": total, "batches": batches})
    else:
        click.echo(f"purged {total} expired record(s) in {batches} batch(es)")

