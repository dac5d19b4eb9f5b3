"""The checker itself: it accepts histories that have a linearization (even one that
reorders concurrent operations, or places an indeterminate one late), and it finds the
violations a broken store produces — in hand-written histories and in a history recorded
from a deliberately broken store under a forced race."""

from __future__ import annotations

import threading
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import MemoryStore
from idempotent_tasks._core.records import CreateResult, Scope, StoredRecord

from .checker import check
from .history import Op, Recorder, load
from .workload import Workload

_seq = count(1)
H = "h1"


def op(
    process: str, name: str, args: dict[str, Any], start: int, end: int | None,
    result: Any = None, *, key: str = "k", known: bool = True,
) -> Op:
    return Op(process, next(_seq), name, key, args, start, end, known, result)


def rec(token: int, now: float, lease: float, status: str = "PROCESSING",
        response: str | None = None, updated: float | None = None,
        expires: float | None = None) -> list[Any]:
    return [status, H, response, token, now, now if updated is None else updated,
            None if status != "PROCESSING" else lease, expires]


def created(token: int, now: float, lease: float) -> dict[str, Any]:
    return {"created": True, "record": rec(token, now, lease)}


def duplicate(record: list[Any]) -> dict[str, Any]:
    return {"created": False, "record": record}


def claim(now: float, lease: float) -> dict[str, Any]:
    return {"h": H, "now": now, "lease": lease}


def success(token: int, now: float, resp: str = "r") -> dict[str, Any]:
    return {"tok": token, "resp": resp, "now": now, "exp": now + 100}


# -- histories with a linearization ----------------------------------------------------------
def test_concurrent_claims_are_reordered_to_find_the_winner() -> None:
    """B is invoked first, but A's claim won: only the order A, B explains both results."""
    history = [
        op("B", "create", claim(10.0, 40.0), 0, 30, duplicate(rec(7, 11.0, 41.0))),
        op("A", "create", claim(11.0, 41.0), 5, 20, created(7, 11.0, 41.0)),
        op("A", "mark_success", success(7, 12.0), 40, 50, True),
        op("B", "get", {}, 60, 70,
           rec(7, 11.0, 41.0, "SUCCESS", "r", updated=12.0, expires=112.0)),
    ]
    assert check(history).ok


def test_an_indeterminate_claim_may_take_effect_late_or_never() -> None:
    """A's claim never completed (killed); its token shows up in B's read, after B's own
    failed claim attempt — so it took effect, and late."""
    late = [
        op("A", "create", claim(10.0, 40.0), 0, None, known=False),
        op("B", "get", {}, 10, 20, None),
        op("B", "get", {}, 30, 40, rec(5, 10.0, 40.0)),
    ]
    assert check(late).ok
    never = [
        op("A", "create", claim(10.0, 40.0), 0, None, known=False),
        op("B", "create", claim(12.0, 42.0), 30, 40, created(6, 12.0, 42.0)),
    ]
    assert check(never).ok


# -- violations ------------------------------------------------------------------------------
VIOLATIONS = {
    "two owners of one scope": [
        op("A", "create", claim(10.0, 40.0), 0, 20, created(5, 10.0, 40.0)),
        op("B", "create", claim(10.5, 40.5), 5, 25, created(6, 10.5, 40.5)),
    ],
    "a stale read after a completed write": [
        op("A", "create", claim(10.0, 40.0), 0, 10, created(5, 10.0, 40.0)),
        op("A", "mark_success", success(5, 11.0), 20, 30, True),
        op("B", "get", {}, 40, 50, rec(5, 10.0, 40.0)),
    ],
    "a token that goes backwards": [
        op("A", "create", claim(10.0, 40.0), 0, 10, created(9, 10.0, 40.0)),
        op("A", "release", {"tok": 9}, 20, 30, True),
        op("A", "create", claim(11.0, 41.0), 40, 50, created(4, 11.0, 41.0)),
    ],
    "a stale owner's write accepted": [
        op("A", "create", claim(10.0, 10.5), 0, 10, created(5, 10.0, 10.5)),
        op("B", "take_over", {"tok": 5, "now": 20.0, "lease": 50.0}, 20, 30, [1, 6]),
        op("A", "mark_success", success(5, 21.0), 40, 50, True),
    ],
    "a token issued to two scopes": [
        op("A", "create", claim(10.0, 40.0), 0, 10, created(5, 10.0, 40.0), key="k1"),
        op("B", "create", claim(10.0, 40.0), 0, 10, created(5, 10.0, 40.0), key="k2"),
    ],
}


@pytest.mark.parametrize("name", VIOLATIONS)
def test_the_checker_finds_a_violation(name: str) -> None:
    verdict = check(VIOLATIONS[name])
    assert not verdict.ok, name
    assert verdict.violations


class _CheckThenActStore(MemoryStore):
    """Deliberately broken: ``create`` reads, then writes in a second step, and the race
    between the two steps is forced with a barrier — two concurrent claims both win."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)

    def create(
        self, scope: Scope, *, request_hash: str, now: float, lease_expires_at: float
    ) -> CreateResult:
        existing = self.get(scope)
        self.barrier.wait()  # both callers have looked: neither saw a record
        if existing is None:
            self.delete_record(scope)  # the "act" of check-then-act: overwrite blindly
        return super().create(
            scope, request_hash=request_hash, now=now, lease_expires_at=lease_expires_at
        )


class _StaleReadStore(MemoryStore):
    """Deliberately broken: ``get`` answers from a cache filled by the first read."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[Scope, StoredRecord | None] = {}

    def get(self, scope: Scope) -> StoredRecord | None:
        if scope not in self._cache:
            self._cache[scope] = super().get(scope)
        return self._cache[scope]


def test_a_history_recorded_from_a_broken_store_is_refused(tmp_path: Path) -> None:
    """Two threads claim one scope at the same moment through a check-then-act store."""
    store = _CheckThenActStore(parties=2)
    scope = Scope("lin", "op", "k")
    paths = [tmp_path / f"{p}.jsonl" for p in ("a", "b")]

    def claimer(path: Path, name: str, now: float) -> None:
        recorder = Recorder(path, name)
        args = {"h": H, "now": now, "lease": now + 30}
        recorder.call("create", scope, args, lambda: store.create(
            scope, request_hash=H, now=now, lease_expires_at=now + 30))
        recorder.close()

    threads = [threading.Thread(target=claimer, args=(p, p.stem, 10.0 + i))
               for i, p in enumerate(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    history = load(paths)
    assert [op.result["created"] for op in history] == [True, True]
    verdict = check(history)
    assert not verdict.ok
    assert "not linearizable" in verdict.violations[0]


def test_a_workload_against_a_stale_reading_store_is_refused(tmp_path: Path) -> None:
    """The same random workload the store runs use, on one process: sequential, so any
    mismatch at all is a violation — and the stale cache produces one."""
    path = tmp_path / "w.jsonl"
    Workload(_StaleReadStore(), Recorder(path, "w"), keys=["k1", "k2"], seed=7).run(400)
    verdict = check(load([path]))
    assert not verdict.ok


def test_the_same_workload_against_a_sound_store_passes(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    Workload(MemoryStore(), Recorder(path, "w"), keys=["k1", "k2"], seed=7).run(400)
    verdict = check(load([path]))
    assert verdict.ok, verdict.violations
    assert verdict.ops == 400
