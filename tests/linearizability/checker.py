"""A Wing-Gong linearizability checker with Lowe's memoisation (the algorithm of Knossos'
``wgl`` and of Porcupine), for histories of the store contract.

A history is linearizable when its operations can be put in one sequential order that
(1) keeps real time — an operation that completed before another was invoked comes first —
and (2) gives every operation the result it really returned when the sequential
specification (:mod:`.spec`, i.e. ``tests/test_model.py``'s ``Model``) runs them in that
order.  The search, per scope:

1. Events (invocations and completions) in time order form a doubly linked list.
   Indeterminate operations complete at +∞: they may take effect at any point after their
   invocation, or (placed after everything else) never.
2. Walk the list.  At an invocation, try to *linearize* that operation now: if the
   specification accepts its result from the current state, record (operation, state) on a
   stack, take the operation and its completion out of the list (they are spliced back on
   backtracking: "dancing links") and start again from the head.  At a completion whose
   operation is still pending, nothing before it can go first: backtrack — pop the last
   choice, restore its state and try its next alternative (another successor state of a
   nondeterministic step, see :mod:`.spec`), then the next candidate operation.
3. Memoisation (Lowe): a (set of linearized operations, state) pair that was reached
   before is never explored again — it failed then and would fail now.  This turns the
   exponential search into one that is fast on the histories real stores produce.
4. The history is linearizable when the list empties; it is not when the stack is empty at
   a completion.

Linearizability is *local* (Herlihy & Wing): a history is linearizable iff each object's
sub-history is, so each scope is checked alone (the model's operations on one scope never
read another's).  Two global rules that cross scopes are checked directly: no fencing
token is issued twice, and (per scope, inside the search) every new token is greater than
every earlier one.

Limits: see ``tests/linearizability/README.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .history import Op, as_mrecord
from .spec import INITIAL, ScopeState, successors

#: Search steps per scope before the check gives up as inconclusive (not as a pass).
DEFAULT_MAX_STEPS = 3_000_000
_INFINITY = float("inf")


class Inconclusive(Exception):
    """The search hit its step bound: neither linearizable nor shown not to be."""


@dataclass
class Verdict:
    ops: int
    scopes: int
    indeterminate: int
    steps: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class _Event:
    __slots__ = ("call", "index", "match", "next", "op", "prev")

    def __init__(self, op: Op | None, index: int, call: bool) -> None:
        self.op, self.index, self.call = op, index, call
        self.prev: _Event | None = None
        self.next: _Event | None = None
        self.match: _Event | None = None  # a call's completion


def check(ops: Sequence[Op], *, max_steps: int = DEFAULT_MAX_STEPS) -> Verdict:
    """Check a whole history: every scope's sub-history, and tokens issued once."""
    ops = [op for op in ops if op.known or op.name not in ("get", "get_retry_count")]
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    verdict = Verdict(len(ops), len(by_key), sum(not op.known for op in ops))
    twice = [t for t, n in Counter(issued_tokens(ops)).items() if n > 1]
    if twice:
        verdict.violations.append(f"fencing tokens issued twice: {sorted(twice)}")
    for key, sub in sorted(by_key.items()):
        steps, failure = check_scope(sub, max_steps=max_steps)
        verdict.steps += steps
        if failure is not None:
            verdict.violations.append(f"scope {key!r}: {failure}")
    return verdict


def issued_tokens(ops: Iterable[Op]) -> list[int]:
    """The tokens that known claims report they issued."""
    tokens = []
    for op in ops:
        if not op.known:
            continue
        if op.name == "create" and op.result["created"]:
            tokens.append(op.result["record"][3])
        elif op.name == "take_over" and op.result is not None:
            tokens.append(op.result[1])
    return tokens


def orphan_tokens(ops: Sequence[Op]) -> list[int]:
    """Tokens seen in records that no known claim issued: only an indeterminate claim can
    have issued them, so they are its candidates."""
    seen = set()
    for op in ops:
        if op.known and op.name in ("get", "create"):
            raw = op.result if op.name == "get" else op.result["record"]
            rec = as_mrecord(raw)
            if rec is not None:
                seen.add(rec.token)
    return sorted(seen - set(issued_tokens(ops)))


def _events(ops: Sequence[Op]) -> _Event:
    """The doubly linked list of events in time order (a call before a completion at the
    same instant: they overlap), behind a head sentinel."""
    timed: list[tuple[float, int, _Event]] = []
    for i, op in enumerate(ops):
        call, done = _Event(op, i, True), _Event(op, i, False)
        call.match = done
        end: float = op.completed if op.known and op.completed is not None else _INFINITY
        timed += [(op.invoked, 0, call), (end, 1, done)]
    timed.sort(key=lambda t: (t[0], t[1], t[2].index))
    head = _Event(None, -1, False)
    last = head
    for _, _, event in timed:
        last.next, event.prev, last = event, last, event
    return head


def _lift(event: _Event) -> None:
    for e in (event, event.match):
        assert e is not None and e.prev is not None
        e.prev.next = e.next
        if e.next is not None:
            e.next.prev = e.prev


def _unlift(event: _Event) -> None:
    for e in (event.match, event):
        assert e is not None and e.prev is not None
        e.prev.next = e
        if e.next is not None:
            e.next.prev = e


def check_scope(ops: Sequence[Op], *, max_steps: int = DEFAULT_MAX_STEPS) -> tuple[int, str | None]:
    """(search steps, ``None`` or why no linearization exists) for one scope's ops."""
    search = _Search(ops, max_steps)
    if search.run():
        return search.steps, None
    return search.steps, search.explain()


class _Search:
    def __init__(self, ops: Sequence[Op], max_steps: int) -> None:
        self.ops = ops
        self.max_steps = max_steps
        self.candidates = orphan_tokens(ops)
        self.head = _events(ops)
        self.steps = 0
        self.depth = 0
        self.best: list[Op] = []
        self.stuck: list[Op] = []
        self._successors: dict[tuple[int, ScopeState], list[ScopeState]] = {}

    def successors(self, event: _Event, state: ScopeState) -> list[ScopeState]:
        key = (event.index, state)
        found = self._successors.get(key)
        if found is None:
            assert event.op is not None
            found = self._successors[key] = successors(
                state, event.op, self.candidates, placeholder=-1 - event.index
            )
        return found

    def run(self) -> bool:
        head = self.head
        state, linearized = INITIAL, 0
        seen: set[tuple[int, ScopeState]] = set()
        stack: list[tuple[_Event, ScopeState, int]] = []
        entry, variant = head.next, 0
        while head.next is not None:
            self.steps += 1
            if self.steps > self.max_steps:
                raise Inconclusive(f"no verdict after {self.max_steps} steps")
            assert entry is not None
            if not entry.call:  # a pending operation's completion: backtrack
                if not stack:
                    return False
                entry, state, variant = stack.pop()
                linearized &= ~(1 << entry.index)
                _unlift(entry)
                variant += 1
                continue
            options = self.successors(entry, state)
            while variant < len(options):
                key = (linearized | 1 << entry.index, options[variant])
                if key not in seen:
                    break
                variant += 1
            if variant == len(options):  # cannot go now: try the next candidate
                entry, variant = entry.next, 0
                continue
            seen.add(key)
            stack.append((entry, state, variant))
            state, linearized = options[variant], key[0]
            _lift(entry)
            self._note(stack)
            entry, variant = head.next, 0
        return True

    def _note(self, stack: list[tuple[_Event, ScopeState, int]]) -> None:
        """Remember the longest linearizable prefix and what could not follow it."""
        if len(stack) <= self.depth:
            return
        self.depth = len(stack)
        self.best = [e.op for e, _, _ in stack[-6:] if e.op is not None]
        self.stuck = []
        e = self.head.next
        while e is not None and e.call:
            assert e.op is not None
            self.stuck.append(e.op)
            e = e.next
        if e is not None and e.op is not None:
            self.stuck.append(e.op)  # the first completion: it had to come before the rest

    def explain(self) -> str:
        tail = "\n    ".join(str(op) for op in self.best)
        stuck = "\n    ".join(str(op) for op in self.stuck[:8])
        return (f"not linearizable: {self.depth} of {len(self.ops)} operations linearize "
                f"at most; the last of them:\n    {tail}\n  and none of these can follow:"
                f"\n    {stuck}")
