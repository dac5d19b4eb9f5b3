"""Histories: what each process asked a store and what it got back, with real-time bounds.

Every operation is written as two JSON lines — ``invoke`` before the call, ``complete``
after it — to a file of the process's own (one ``os.write`` of an ``O_APPEND`` descriptor
per line, so a SIGKILL loses at most the line being written, never an earlier one).  Times
are ``CLOCK_MONOTONIC`` nanoseconds, one clock for every process of the machine, so they
order events across processes.

An operation without a completion (the process was killed inside it), or whose call
raised (a dropped connection, a timeout: the request may or may not have reached the
store), is *indeterminate*: it may have taken effect at any moment after its invocation,
or never, and its result is unknown.  The checker treats it exactly so.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idempotent_tasks._core.records import CreateResult, Scope, Status, StoredRecord
from idempotent_tasks.stores.base import FailureResult, TakeOver
from tests.test_model import MRecord

#: The operations of the store contract a history may hold.
WRITES = ("create", "take_over", "heartbeat", "mark_success", "mark_failed", "release",
          "record_failure")
READS = ("get", "get_retry_count")


@dataclass(frozen=True)
class Op:
    """One operation of one process: ``result`` is ``None`` when ``known`` is False."""

    process: str
    seq: int
    name: str
    key: str  # the scope's key: one tenant and operation per run
    args: dict[str, Any]
    invoked: int
    completed: int | None  # None: no completion (killed inside the call)
    known: bool
    result: Any = None
    error: str | None = None

    def __str__(self) -> str:
        outcome = repr(self.result) if self.known else f"? ({self.error or 'killed'})"
        return f"{self.process}#{self.seq} {self.name}({self.key}, {self.args}) -> {outcome}"


# -- encoding: store values <-> JSON --------------------------------------------------------
def record_json(rec: StoredRecord | None) -> list[Any] | None:
    if rec is None:
        return None
    response = None if rec.response is None else rec.response.decode("latin-1")
    return [rec.status.value, rec.request_hash, response, rec.fencing_token, rec.created_at,
            rec.updated_at, rec.lease_expires_at, rec.expires_at]


def as_mrecord(raw: list[Any] | None) -> MRecord | None:
    if raw is None:
        return None
    status, rh, response, token, ca, ua, le, ea = raw
    return MRecord(Status(status), rh, None if response is None else response.encode("latin-1"),
                   token, ca, ua, le, ea)


def result_json(name: str, value: Any) -> Any:
    """What a store call returned, as JSON (the checker reads it back with the model)."""
    if name == "create":
        assert isinstance(value, CreateResult)
        return {"created": value.created, "record": record_json(value.record)}
    if name == "get":
        return record_json(value)
    if isinstance(value, TakeOver):
        return [value.retry_count, value.token]
    if isinstance(value, FailureResult):
        return [value.retry_count, value.poisoned]
    return value  # bool, int or None


# -- recording -------------------------------------------------------------------------------
class Recorder:
    """Writes one process's history; ``call`` runs one store operation between its lines."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seq = 0

    def _line(self, entry: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    def call(self, name: str, scope: Scope, args: dict[str, Any], fn: Callable[[], Any]) -> Any:
        """Record and run ``fn`` (the store call); an exception is recorded as an unknown
        outcome and re-raised."""
        self._seq += 1
        n = self._seq
        self._line({"e": "i", "p": self.process, "n": n, "op": name, "k": scope.key,
                    "a": args, "t": time.monotonic_ns()})
        try:
            value = fn()
        except Exception as exc:
            self._line({"e": "x", "p": self.process, "n": n, "t": time.monotonic_ns(),
                        "err": type(exc).__name__})
            raise
        self._line({"e": "c", "p": self.process, "n": n, "t": time.monotonic_ns(),
                    "r": result_json(name, value)})
        return value

    def close(self) -> None:
        os.close(self._fd)


# -- reading ---------------------------------------------------------------------------------
@dataclass
class _Pending:
    entry: dict[str, Any]
    ends: list[dict[str, Any]] = field(default_factory=list)


def read_lines(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line cut by SIGKILL mid-write is not an entry
                yield json.loads(line)


def load(paths: Iterable[Path]) -> list[Op]:
    """Every operation of the histories in ``paths``, in invocation order."""
    pending: dict[tuple[str, int], _Pending] = {}
    for entry in read_lines(paths):
        ident = (entry["p"], entry["n"])
        if entry["e"] == "i":
            pending[ident] = _Pending(entry)
        else:
            pending[ident].ends.append(entry)
    ops = [_op(p.entry, p.ends[0] if p.ends else None) for p in pending.values()]
    return sorted(ops, key=lambda op: op.invoked)


def _op(invoke: dict[str, Any], end: dict[str, Any] | None) -> Op:
    known = end is not None and end["e"] == "c"
    return Op(
        process=invoke["p"], seq=invoke["n"], name=invoke["op"], key=invoke["k"],
        args=invoke["a"], invoked=invoke["t"],
        completed=None if end is None else end["t"], known=known,
        result=end["r"] if known and end is not None else None,
        error=None if end is None or known else end.get("err"),
    )
