"""``inspect``, ``list``, ``stats`` and ``unpoison``: looking at scopes, and the one audited
way to give a poisoned scope another chance."""

from __future__ import annotations

import getpass
import os

import click

from .._core.errors import ErrorCode
from .._core.handler import IdempotencyHandler
from .._core.records import Record, Status
from ._app import CliError, CliState, make_console, pass_state
from ._render import (
    echo_json,
    inspected_document,
    inspected_tables,
    listed_document,
    record_document,
    record_table,
    records_table,
)

_STATUSES = [s.value for s in Status]


def _load(handler: IdempotencyHandler, tenant: str, operation: str, key: str) -> Record:
    """The scope's live record (the handler validates the scope: a bad one exits 2), or
    RECORD_NOT_FOUND telling the counter too: a released scope has no record but may
    already have counted failures."""
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    if record is None:
        count = handler.retry_count(operation=operation, tenant=tenant, key=key)
        raise CliError(
            ErrorCode.RECORD_NOT_FOUND,
            f"no live record for tenant={tenant!r} operation={operation!r} "
            f"key={key!r} (retry counter: {count})",
        )
    return record


@click.command()
@click.argument("tenant")
@click.argument("operation")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def inspect(state: CliState, tenant: str, operation: str, key: str, as_json: bool) -> None:
    """Show one scope's record: status, retry counter, result, lease and timestamps, and
    its past attempts (the settled attempts a new attempt replaced, oldest first).

    Exit 3 (RECORD_NOT_FOUND) when the scope has no live record.
    """
    handler = state.handler()
    record = _load(handler, tenant, operation, key)
    attempts = handler.get_attempts(operation=operation, tenant=tenant, key=key)
    now = handler.clock()
    doc = inspected_document(record, attempts, now)
    if as_json:
        echo_json(doc)
        return
    console = make_console()
    for table in inspected_tables(doc, now):
        console.print(table)


@click.command(name="list")
@click.option("--status", type=click.Choice(_STATUSES, case_sensitive=False), default=None)
@click.option("--operation", default=None, help="Only this operation.")
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def list_(
    state: CliState,
    status: str | None,
    operation: str | None,
    tenant: str | None,
    limit: int,
    offset: int,
    as_json: bool,
) -> None:
    """List records, oldest first, one page at a time (--limit/--offset)."""
    handler = state.handler()
    rows = handler.list_records(
        status=None if status is None else Status(status.upper()),
        operation=operation, tenant=tenant, limit=limit, offset=offset,
    )
    now = handler.clock()
    docs = [listed_document(r, now) for r in rows]
    next_offset = offset + len(docs) if len(docs) == limit else None
    if as_json:
        echo_json({"records": docs, "offset": offset, "limit": limit, "next_offset": next_offset})
        return
    if not docs:
        click.echo("no records match" + (f" at offset {offset}" if offset else ""))
        return
    title = f"records {offset + 1}-{offset + len(docs)}"
    make_console().print(records_table(docs, now, title))
    if next_offset is not None:
        click.echo(f"more may follow: --offset {next_offset}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def stats(state: CliState, as_json: bool) -> None:
    """Count records by operation and status."""
    handler = state.handler()
    counts = handler.record_counts()
    by_operation: dict[str, dict[str, int]] = {}
    by_status = dict.fromkeys(_STATUSES, 0)
    for (operation, status), n in sorted(counts.items()):
        by_operation.setdefault(operation, dict.fromkeys(_STATUSES, 0))[status.value] += n
        by_status[status.value] += n
    total = sum(by_status.values())
    if as_json:
        echo_json({"by_operation": by_operation, "by_status": by_status, "total": total})
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"records in {state.display_url}"), title_justify="left")
    table.add_column("operation")
    for name in (*_STATUSES, "total"):
        table.add_column(name, justify="right")
    for operation, row in by_operation.items():
        table.add_row(escape(operation), *(str(row[s]) for s in _STATUSES), str(sum(row.values())))
    table.add_section()
    table.add_row("all", *(str(by_status[s]) for s in _STATUSES), str(total), style="bold")
    make_console().print(table)


def _default_actor() -> str:
    """Who is unpoisoning, for the audit entry: $USER, else the login name."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "unknown"


@click.command()
@click.argument("tenant")
@click.argument("operation")
@click.argument("key")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts).")
@click.option("--actor", default=None, help="Who does this, for the audit entry [$USER].")
@click.option("--json", "as_json", is_flag=True, help="Print the old state as JSON.")
@pass_state
def unpoison(
    state: CliState,
    tenant: str,
    operation: str,
    key: str,
    yes: bool,
    actor: str | None,
    as_json: bool,
) -> None:
    """Delete a FAILED (poisoned) record and reset its retry counter, so that the next
    delivery runs the body again.  Logs an audit entry ("unpoisoned") with the old state.

    Only FAILED records qualify: exit 3 for a scope without one.
    """
    handler = state.handler()
    current = _load(handler, tenant, operation, key)
    if current.status is not Status.FAILED:
        raise CliError(
            ErrorCode.RECORD_NOT_FOUND,
            f"the scope is {current.status.value}, not FAILED: there is nothing to unpoison",
        )
    console = make_console()
    if not yes:
        console.print(record_table(record_document(current, handler.clock()), handler.clock(),
                                   "record to unpoison"))
        click.confirm("Delete this FAILED record and reset its retry counter?", abort=True)
    who = actor or _default_actor()
    old = handler.unpoison(operation=current.operation, tenant=current.tenant,
                           key=current.key, actor=f"cli:{who}")
    now = handler.clock()
    doc = record_document(old, now)
    if as_json:
        echo_json({"unpoisoned": True, "actor": f"cli:{who}", "old": doc})
        return
    console.print(record_table(doc, now, "old state (deleted)"))
    click.echo(
        f"unpoisoned by cli:{who}: record deleted, retry counter reset from {old.retry_count} "
        "to 0; the next delivery runs the body again"
    )
