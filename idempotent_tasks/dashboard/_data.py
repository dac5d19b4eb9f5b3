"""What the pages show, read through the handler's public operator calls.

Every read and every action goes through the handler (``list_records``, ``record_counts``,
``find_stuck_records``, ``get_record``, ``get_attempts``, ``unpoison``, ``resolve``): the
dashboard never talks to the store itself, so it sees exactly what the CLI and the workers
see.  On a sync store the calls are their ``*_async`` twins, so no store call runs on the
event loop.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool

from .._core.handler import IdempotencyHandler
from .._core.records import Record, Status

#: Records shown on one page of the list.
PAGE_SIZE = 50
#: Dashboard actions remembered per process (newest first on a record's page).
ACTION_LOG_SIZE = 1000


async def call(handler: IdempotencyHandler, name: str, **kwargs: Any) -> Any:
    """``await handler.<name>_async(**kwargs)``: the twin works on every store (natively on
    an async one, on the handler's executor on a sync one), never blocking the event loop.
    A call without a twin runs in Starlette's thread pool."""
    twin = getattr(handler, f"{name}_async", None)
    if callable(twin):
        return await twin(**kwargs)
    return await run_in_threadpool(getattr(handler, name), **kwargs)


def statuses() -> list[str]:
    """Every status a record can have, spelled as the ``Status`` enum's values."""
    return [status.value for status in Status]


def record_path(record: Record | tuple[str, str, str]) -> str:
    """``/records/{tenant}/{operation}/{key}`` with each part percent-encoded (any part may
    hold ``/``, ``?`` or spaces)."""
    tenant, operation, key = (
        (record.tenant, record.operation, record.key) if isinstance(record, Record) else record
    )
    return "/records/" + "/".join(quote(part, safe="") for part in (tenant, operation, key))


def when(ts: float | None) -> str:
    """An epoch timestamp as UTC, to the second ("" for none)."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def lease_state(record: Record, now: float) -> str:
    """"live (12 s left)", "expired 30 s ago" or "" for a settled record."""
    if record.status is not Status.PROCESSING or record.lease_expires_at is None:
        return ""
    left = record.lease_expires_at - now
    if left > 0:
        return f"live ({left:.0f} s left)"
    return f"expired {-left:.0f} s ago"


def row(record: Record, now: float) -> dict[str, Any]:
    """One line of the record list."""
    lease = lease_state(record, now)
    return {
        "tenant": record.tenant, "operation": record.operation, "key": record.key,
        "status": record.status.value, "retry_count": record.retry_count,
        "fencing_token": record.fencing_token, "updated_at": when(record.updated_at),
        "lease": lease, "stuck": lease.startswith("expired"), "path": record_path(record),
    }


def detail(record: Record, now: float, *, show_response: bool) -> dict[str, Any]:
    """Everything the record page shows; the stored result only when asked for."""
    shown = row(record, now)
    shown.update(
        request_hash=record.request_hash,
        created_at=when(record.created_at),
        expires_at=when(record.expires_at),
        lease_expires_at=when(record.lease_expires_at),
        has_response=record.response is not None,
        response=_pretty(record.response) if show_response and record.response is not None
        else None,
        uncertain_detail=record.detail,  # UNCERTAIN: why reconciliation could not tell
    )
    return shown


def _pretty(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)


@dataclass
class Counts:
    """Records per operation and status, with the totals of each."""

    statuses: list[str]
    by_operation: dict[str, dict[str, int]] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, counts: Mapping[tuple[str, Status], int]) -> Counts:
        table = cls(statuses())
        table.by_status = dict.fromkeys(table.statuses, 0)
        for (operation, status), n in sorted(counts.items()):
            name = Status(status).value
            line = table.by_operation.setdefault(operation, dict.fromkeys(table.statuses, 0))
            line[name] = line.get(name, 0) + n
            table.by_status[name] = table.by_status.get(name, 0) + n
        return table

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True)
class Action:
    """One action taken from this dashboard: the audit line a record's page shows."""

    at: str
    actor: str
    action: str
    detail: str


class ActionLog:
    """The dashboard's own actions in this process, newest first, per scope.

    The durable audit entries are the library's log lines (``unpoisoned`` with its
    ``actor``, ``uncertain_resolved`` with its ``by``); this is what the page can show
    without a log search."""

    def __init__(self) -> None:
        self._entries: deque[tuple[tuple[str, str, str], Action]] = deque(maxlen=ACTION_LOG_SIZE)

    def add(self, scope: tuple[str, str, str], action: Action) -> None:
        self._entries.appendleft((scope, action))

    def of(self, scope: tuple[str, str, str]) -> list[Action]:
        return [action for s, action in self._entries if s == scope]


async def audit_entries(handler: IdempotencyHandler, scope: tuple[str, str, str]) -> list[Any]:
    """The handler's own audit trail of a scope, when it keeps one (``audit_trail``)."""
    trail = getattr(handler, "audit_trail", None)
    if not callable(trail):
        return []
    tenant, operation, key = scope
    entries = await call(handler, "audit_trail", operation=operation, tenant=tenant, key=key)
    return list(entries)


async def past_attempts(
    handler: IdempotencyHandler, scope: tuple[str, str, str]
) -> list[dict[str, Any]]:
    """The settled attempts a new attempt of the scope replaced (``get_attempts``), oldest
    first, as the record page shows them."""
    tenant, operation, key = scope
    attempts = await call(handler, "get_attempts", operation=operation, tenant=tenant, key=key)
    return [
        {"fencing_token": a.fencing_token, "status": a.status.value,
         "settled_at": when(a.settled_at), "detail": a.detail}
        for a in attempts
    ]


__all__ = [
    "PAGE_SIZE",
    "Action",
    "ActionLog",
    "Counts",
    "audit_entries",
    "call",
    "detail",
    "lease_state",
    "past_attempts",
    "record_path",
    "row",
    "statuses",
    "when",
]
