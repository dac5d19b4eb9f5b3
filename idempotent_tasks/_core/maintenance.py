"""Recovery and cleanup (the jobs the production guide says to run from day one), and the
operators' reads and writes, as flows like the execution algorithm (so the same code runs on
the sync and the async path).

``recover`` and ``cleanup`` are safe to run from many workers at once: every change they make
is a conditional store write, so a record is handled by exactly one of them.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ..stores.effects import Resolution
from .commands import Command
from .engine import Call, Engine
from .errors import ConfigurationError, ErrorCode, make_error
from .records import Record, Scope, Status, StoredRecord
from .store_calls import (
    DeleteExpired,
    DeleteRecord,
    FindStuck,
    Get,
    GetRetryCount,
    MarkFailed,
    RecordFailure,
    ResetRetryCount,
    ResolveUncertain,
)

Step = Generator[Command, Any, Any]


def recover(engine: Engine, timeout: float | None, limit: int) -> Generator[Command, Any, int]:
    """Handle PROCESSING records whose lease expired (and, with ``timeout``, whose last
    heartbeat is older than it): count the crashed attempt and release or poison
    (``on_stuck="retry"``), or poison (``"fail"``).  Returns the records handled."""
    now = engine.clock()
    heartbeat_before = None if timeout is None else now - timeout
    stuck = yield FindStuck(now, heartbeat_before, limit)
    handled = 0
    for record in stuck:
        if (yield from _recover_one(engine, record, now)):
            handled += 1
    if handled:
        engine.metrics.recovered(handled)
    engine.log.info("recovery_run", found=len(stuck), handled=handled, status="PROCESSING")
    return handled


def _recover_one(engine: Engine, record: StoredRecord, now: float) -> Step:
    s = record.scope
    opts = engine.options_for(s.operation)
    fields = {"tenant": s.tenant, "operation": s.operation, "key": s.key}
    if opts.on_stuck == "fail":
        ok = yield MarkFailed(s, record.fencing_token, now, now + opts.ttl,
                              only_if_lease_expired=True)
        if ok:
            engine.metrics.poisoned(s.operation)
            engine.log.warning("recovered_poisoned", status="FAILED", **fields)
        return bool(ok)
    result = yield RecordFailure(s, record.fencing_token, now, opts.max_retries,
                                 now + opts.ttl, only_if_lease_expired=True)
    if result is None:
        return False
    if result.poisoned:
        engine.metrics.poisoned(s.operation)
    engine.log.warning(
        "recovered", status="FAILED" if result.poisoned else "RELEASED",
        retry_count=result.retry_count, **fields,
    )
    return True


def cleanup(engine: Engine, limit: int) -> Generator[Command, Any, int]:
    """Purge expired SUCCESS/FAILED records and stale counters; returns records purged."""
    now = engine.clock()
    purged = yield DeleteExpired(now, now - engine.defaults.ttl, limit)
    if purged:
        engine.metrics.cleaned(purged)
    engine.log.info("cleanup_run", purged=purged, status="EXPIRED")
    return int(purged)


def get_record(engine: Engine, scope: Scope) -> Generator[Command, Any, Record | None]:
    """The live record of a scope (an expired one counts as absent), counter included."""
    stored = yield Get(scope)
    if stored is None or engine.expired(stored, engine.clock()):
        return None
    count = yield GetRetryCount(scope)
    return engine.to_record(stored, count)


def unpoison(engine: Engine, scope: Scope, actor: str) -> Generator[Command, Any, Record]:
    """Delete a FAILED record and reset its counter (audited); RECORD_NOT_FOUND if absent."""
    count = yield GetRetryCount(scope)
    deleted = yield DeleteRecord(scope, Status.FAILED)
    if deleted is None:
        raise make_error(
            ErrorCode.RECORD_NOT_FOUND, "no FAILED record for this scope",
            tenant=scope.tenant, operation=scope.operation, key=scope.key,
        )
    yield ResetRetryCount(scope)
    old = engine.to_record(deleted, count)
    engine.log.warning(
        "unpoisoned", actor=actor, tenant=scope.tenant, operation=scope.operation, key=scope.key,
        status="FAILED", old_retry_count=count, old_request_hash=old.request_hash,
        old_created_at=old.created_at, old_updated_at=old.updated_at,
    )
    return old


#: ``resolve(done=...)``'s default: no result given (``None`` is a result).
UNSET: Any = object()


def resolve(
    engine: Engine, scope: Scope, resolution: Resolution, result: Any, by: str
) -> Generator[Command, Any, Record | None]:
    """Settle an UNCERTAIN record (audited): ``done`` → SUCCESS with ``result``, ``fail`` →
    FAILED, ``retry`` → released (the next delivery runs as a new attempt, replaying the
    recorded steps).  The record after it (``None`` for ``retry``); RECORD_NOT_FOUND when
    the scope has no UNCERTAIN record."""
    if not hasattr(engine.store, "resolve_uncertain"):
        raise ConfigurationError(f"{type(engine.store).__name__} has no UNCERTAIN records")
    record = yield Get(scope)
    opts, now = engine.options_for(scope.operation), engine.clock()
    response = None
    if resolution == "done":
        response = engine.encode_response(Call(scope, "", opts), result)
    changed = record is not None and record.status is Status.UNCERTAIN and (
        yield ResolveUncertain(scope, resolution, now, response, now + opts.ttl)
    )
    if not changed:
        raise make_error(
            ErrorCode.RECORD_NOT_FOUND, "no UNCERTAIN record for this scope",
            tenant=scope.tenant, operation=scope.operation, key=scope.key,
        )
    assert record is not None
    engine.log.warning(
        "uncertain_resolved", by=by, resolution=resolution, tenant=scope.tenant,
        operation=scope.operation, key=scope.key, status="UNCERTAIN",
        old_fencing_token=record.fencing_token,
        old_detail=(record.response or b"").decode("utf-8", "replace"),
    )
    return (yield from get_record(engine, scope))


__all__ = ["UNSET", "cleanup", "get_record", "recover", "resolve", "unpoison"]
