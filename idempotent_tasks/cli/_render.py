"""How records look to an operator: JSON documents for scripts, rich tables for people.

Timestamps are shown both ways on purpose: ISO 8601 (UTC) to read, epoch seconds to compare
with what the store holds and what the logs print.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .._core.attempts import Attempt
from .._core.records import Record, Status

_TIMESTAMPS = ("created_at", "updated_at", "lease_expires_at", "expires_at")
_RESPONSE_PREVIEW = 400


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC (``None`` stays ``None``)."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds")


def duration(seconds: float) -> str:
    """A non-negative duration in at most two units: ``"59s"``, ``"47m 0s"``, ``"2h 5m"``,
    ``"3d 4h"``.  Rounded to whole seconds *before* it is split, so a unit never reads 60
    (``2819.6`` s is ``"47m 0s"``, not ``"46m 60s"``)."""
    total = round(abs(seconds))
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60}s"
    if total < 86400:
        return f"{total // 3600}h {total % 3600 // 60}m"
    return f"{total // 86400}d {total % 86400 // 3600}h"


def ago(ts: float | None, now: float) -> str:
    """A human offset such as ``"in 4m 10s"`` or ``"12s ago"``."""
    if ts is None:
        return "-"
    delta = ts - now
    text = duration(delta)
    return f"in {text}" if delta >= 0 else f"{text} ago"


def with_iso(fields: dict[str, Any]) -> dict[str, Any]:
    """Add ``<name>_iso`` next to every epoch timestamp field."""
    out = dict(fields)
    for name in _TIMESTAMPS:
        if name in out:
            out[f"{name}_iso"] = iso(out[name])
    return out


def lease_state(status: Status, lease_expires_at: float | None, now: float) -> str | None:
    """For PROCESSING records: ``live`` (a worker owns it) or ``expired`` (crashed owner)."""
    if status is not Status.PROCESSING:
        return None
    if lease_expires_at is not None and lease_expires_at > now:
        return "live"
    return "expired"


def record_document(record: Record, now: float) -> dict[str, Any]:
    """Everything ``inspect --json`` promises about one scope."""
    doc: dict[str, Any] = {
        "tenant": record.tenant,
        "operation": record.operation,
        "key": record.key,
        "status": record.status.value,
        "request_hash": record.request_hash,
        "response": record.response,
        "retry_count": record.retry_count,
        "fencing_token": record.fencing_token,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "lease_expires_at": record.lease_expires_at,
        "expires_at": record.expires_at,
        "lease": lease_state(record.status, record.lease_expires_at, now),
    }
    if record.detail is not None:  # UNCERTAIN: why reconciliation could not tell
        doc["detail"] = record.detail
    return with_iso(doc)


def attempt_document(attempt: Attempt) -> dict[str, Any]:
    """One past attempt of a scope (``inspect``'s ``attempts``)."""
    return {
        "fencing_token": attempt.fencing_token,
        "status": attempt.status.value,
        "settled_at": attempt.settled_at,
        "settled_at_iso": iso(attempt.settled_at),
        "detail": attempt.detail,
    }


def attempts_table(docs: Iterable[Mapping[str, Any]], now: float) -> Table:
    """The past attempts a reuse policy replaced, oldest first, one per row."""
    table = Table(title="past attempts", title_justify="left")
    for name in ("fencing_token", "status", "settled", "detail"):
        table.add_column(name, overflow="fold")
    for doc in docs:
        settled = f"{doc['settled_at_iso']} ({ago(doc['settled_at'], now)})"
        detail = "-" if doc["detail"] is None else str(doc["detail"])
        table.add_row(*(escape(str(cell)) for cell in (
            doc["fencing_token"], doc["status"], settled, detail
        )))
    return table


def inspected_document(record: Record, attempts: Iterable[Attempt], now: float) -> dict[str, Any]:
    """``inspect --json``: the record's document and its past attempts (``attempts``)."""
    doc = record_document(record, now)
    doc["attempts"] = [attempt_document(a) for a in attempts]
    return doc


def inspected_tables(doc: Mapping[str, Any], now: float) -> list[Table]:
    """``inspect``'s tables: the record, then its past attempts when it has any."""
    tables = [record_table(doc, now, f"{doc['status']} record")]
    if doc["attempts"]:
        tables.append(attempts_table(doc["attempts"], now))
    return tables


def listed_document(record: Record, now: float) -> dict[str, Any]:
    """A listed record (``list --json``, dry runs); the response stays out of pages."""
    doc: dict[str, Any] = {
        "tenant": record.tenant,
        "operation": record.operation,
        "key": record.key,
        "status": record.status.value,
        "retry_count": record.retry_count,
        "fencing_token": record.fencing_token,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "lease_expires_at": record.lease_expires_at,
        "expires_at": record.expires_at,
        "lease": lease_state(record.status, record.lease_expires_at, now),
        "expired": record.expires_at is not None and record.expires_at <= now,
    }
    return with_iso(doc)


def echo_json(value: Any) -> None:
    """Plain JSON on stdout (no colours), stable key order: made for ``jq`` and scripts."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _preview(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) > _RESPONSE_PREVIEW:
        return text[:_RESPONSE_PREVIEW] + f"… ({len(text)} characters)"
    return text


def record_table(doc: Mapping[str, Any], now: float, title: str) -> Table:
    """One record as a two-column table (field, value)."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name in ("tenant", "operation", "key", "status", "retry_count", "request_hash",
                 "fencing_token"):
        table.add_row(name, escape(str(doc.get(name))))
    if doc.get("lease"):
        table.add_row("lease", str(doc["lease"]))
    for name in _TIMESTAMPS:
        ts = doc.get(name)
        shown = "-" if ts is None else f"{doc[name + '_iso']}  ({ts:.3f}, {ago(ts, now)})"
        table.add_row(name, shown)
    if "response" in doc:
        table.add_row("response", escape(_preview(doc["response"])))
    if "detail" in doc:
        table.add_row("detail", escape(str(doc["detail"])))
    return table


def records_table(
    docs: Iterable[Mapping[str, Any]], now: float, title: str, extra: tuple[str, ...] = ()
) -> Table:
    """Many records, one per row (``list`` and the dry runs); ``extra`` names more fields
    of each document to show as trailing columns."""
    table = Table(title=title, title_justify="left")
    for name in ("tenant", "operation", "key", "status", "retries", "created", "updated",
                 "lease / expiry", *extra):
        table.add_column(name, overflow="fold")
    for doc in docs:
        status = str(doc["status"])
        if doc.get("expired"):
            status += " (expired)"
        if doc.get("lease"):
            when = f"lease {doc['lease']} ({ago(doc.get('lease_expires_at'), now)})"
        else:
            when = f"expires {ago(doc.get('expires_at'), now)}"
        cells = [
            doc["tenant"], doc["operation"], doc["key"], status, doc.get("retry_count", "-"),
            doc["created_at_iso"], doc["updated_at_iso"], when,
            *(doc.get(name, "") for name in extra),
        ]
        table.add_row(*(escape(str(cell)) for cell in cells))
    return table


def print_table(console: Console, table: Table) -> None:
    console.print(table)
