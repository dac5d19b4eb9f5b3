"""Property tests of the handler (docs/design.md) on the MemoryStore.

1. Any sequence of deliveries of one scope, each with an outcome drawn from {success,
   permanent failure, transient failure, crash}, interleaved with recovery runs: the body runs
   at most ``max_retries`` times in total and never after a success, every replay equals the
   first fresh result, the retry counter equals the number of counted failures, and every
   answer and the final state are what docs/design.md says (checked step by step against a small model
   and, at the end, against a history-based statement of the same rules).
2. Canonical hashing (docs/design.md, step 1): dict key order and tuple-vs-list never change the request hash;
   different JSON values always do.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    JSONSerializer,
    MemoryStore,
    Status,
)
from idempotent_tasks import Outcome as EngineOutcome
from idempotent_tasks._core.records import Scope
from idempotent_tasks.testing import FakeClock, simulate_crash

OP, TENANT, KEY = "payments.charge", "acme", "key-1"
SCOPE = Scope(TENANT, OP, KEY)
PAYLOAD = {"amount": 100, "currency": "EUR"}
LEASE = 30.0
SERIALIZER = JSONSerializer()

PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

Outcome = Literal["success", "permanent", "transient", "crash"]


class Permanent(Exception):
    pass


class Transient(Exception):
    pass


# -- JSON values --------------------------------------------------------------------------------
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def roundtrip(value: Any) -> Any:
    return SERIALIZER.loads(SERIALIZER.dumps(value))


# -- 1. delivery sequences ----------------------------------------------------------------------
@dataclasses.dataclass
class Model:
    """One scope's state as docs/design.md describes it."""

    max_retries: int
    on_stuck: Literal["retry", "fail"]
    status: Status | None = None
    lease_until: float = 0.0
    stored: Any = None
    counter: int = 0

    def claim(self, now: float) -> tuple[bool, tuple[Any, ...]]:
        """(we own it, otherwise the expected answer)."""
        if self.status is Status.SUCCESS:
            return False, ("returned", self.stored)
        if self.status is Status.FAILED:
            return False, ("error", ErrorCode.REQUEST_FAILED)
        if self.status is Status.PROCESSING:
            if self.lease_until > now:
                return False, ("error", ErrorCode.REQUEST_IN_PROGRESS)
            if self.on_stuck == "fail":
                self.status = Status.FAILED
                return False, ("error", ErrorCode.REQUEST_FAILED)
            if self.count_failure():  # the crashed attempt counts; the last one poisons
                return False, ("error", ErrorCode.REQUEST_FAILED)
        self.status, self.lease_until = Status.PROCESSING, now + LEASE
        return True, ()

    def count_failure(self) -> bool:
        """Count one failed attempt; True when it poisoned the scope."""
        self.counter += 1
        if self.counter >= self.max_retries:
            self.status = Status.FAILED
            return True
        self.status = None
        return False

    def ran(self, outcome: Outcome, value: Any) -> tuple[Any, ...]:
        if outcome == "success":
            self.status, self.stored = Status.SUCCESS, roundtrip(value)
            return ("returned", self.stored)
        if outcome == "permanent":
            self.status = Status.FAILED
            return ("raised", Permanent)
        if outcome == "transient":
            self.count_failure()
            return ("raised", Transient)
        return ("crashed",)

    def recover(self, now: float) -> int:
        if self.status is not Status.PROCESSING or self.lease_until > now:
            return 0
        if self.on_stuck == "fail":
            self.status = Status.FAILED
        else:
            self.count_failure()
        return 1


@dataclasses.dataclass
class Harness:
    handler: IdempotencyHandler
    store: MemoryStore
    clock: FakeClock
    runs: int = 0
    runs_after_success: int = 0
    fresh: list[Any] = dataclasses.field(default_factory=list)
    replays: list[Any] = dataclasses.field(default_factory=list)
    counted: int = 0
    history: list[tuple[str, Any]] = dataclasses.field(default_factory=list)

    def body(self, outcome: Outcome, value: Any) -> Any:
        self.runs += 1
        if self.fresh:
            self.runs_after_success += 1
        if outcome == "permanent":
            raise Permanent()
        if outcome == "transient":
            raise Transient()
        return value

    def deliver(self, outcome: Outcome, value: Any) -> tuple[Any, ...]:
        """One delivery; a crash claims (the body starts) and never finishes."""
        if outcome == "crash":
            got = simulate_crash(self.handler, operation=OP, tenant=TENANT, key=KEY,
                                 payload=PAYLOAD)
            if isinstance(got, EngineOutcome):
                return ("returned", got.result) if got.kind == "replayed" else (
                    "error", got.error_code)
            self.body("success", None)  # the body started …
            return ("crashed",)  # … and the worker died inside it
        try:
            got = self.handler.execute(
                lambda: self.body(outcome, value), operation=OP, tenant=TENANT, key=KEY,
                payload=PAYLOAD, permanent=(Permanent,),
            )
        except IdempotencyError as exc:
            return ("error", exc.code)
        except (Permanent, Transient) as exc:
            return ("raised", type(exc))
        return ("returned", got)


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("deliver"), st.sampled_from(["success", "permanent", "transient", "crash"]),
            json_values,
        ),
        st.tuples(st.just("recover"), st.none(), st.none()),
    ),
    max_size=14,
)


@PROPERTY_SETTINGS
@given(
    max_retries=st.integers(min_value=1, max_value=4),
    on_stuck=st.sampled_from(["retry", "fail"]),
    script=steps,
)
def test_any_delivery_sequence_keeps_the_guarantee(
    max_retries: int, on_stuck: Literal["retry", "fail"], script: list[tuple[str, Any, Any]]
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    handler = IdempotencyHandler(
        store, clock=clock, lease_timeout=LEASE, ttl=1e7, max_retries=max_retries,
        on_stuck=on_stuck, metrics=None,
    )
    h = Harness(handler, store, clock)
    model = Model(max_retries, on_stuck)
    for kind, outcome, value in script:
        if kind == "recover":
            before = model.counter
            expected_handled = model.recover(clock())
            assert handler.recover_stuck_records() == expected_handled
            h.history.append(("recover", expected_handled))
            h.counted += model.counter - before
        else:
            step(h, model, outcome, value)
        check_state(h, model)
    check_guarantee(h, max_retries, on_stuck)


def step(h: Harness, model: Model, outcome: Outcome, value: Any) -> None:
    runs, counter = h.runs, model.counter
    owned, expected = model.claim(h.clock())
    if owned:
        expected = model.ran(outcome, value)
    got = h.deliver(outcome, value)
    assert got == expected, (outcome, got, expected)
    assert h.runs == runs + owned, "the body ran when it must not, or did not when it must"
    h.counted += model.counter - counter
    h.history.append((outcome if owned else "refused", got))
    if got[0] == "returned":
        (h.fresh if owned else h.replays).append(got[1])
    if outcome == "crash" and owned:
        # a duplicate while the crashed body's lease is live is refused, nothing runs …
        assert h.deliver("success", "dup") == ("error", ErrorCode.REQUEST_IN_PROGRESS)
        assert h.runs == runs + 1
        h.clock.advance(LEASE + 1)  # … then the lease expires: the owner is presumed dead


def check_state(h: Harness, model: Model) -> None:
    rec = h.handler.get_record(operation=OP, tenant=TENANT, key=KEY)
    assert (rec.status if rec else None) == model.status
    assert h.store.get_retry_count(SCOPE) == model.counter == h.counted
    if rec is not None:
        assert rec.retry_count == model.counter
        if rec.status is Status.SUCCESS:
            assert rec.response == model.stored


def check_guarantee(h: Harness, max_retries: int, on_stuck: Literal["retry", "fail"]) -> None:
    """The same rules stated on the history alone, independent of :class:`Model`."""
    assert h.runs <= max_retries, f"the body ran {h.runs} times with max_retries={max_retries}"
    assert h.runs_after_success == 0, "the body ran again after a success"
    assert len(h.fresh) <= 1
    assert all(r == h.fresh[0] for r in h.replays), "a replay differs from the fresh result"
    ran = [o for o, _ in h.history if o in ("success", "permanent", "transient", "crash")]
    # a crash is found (taken over, recovered or poisoned) by whatever comes next: only a
    # crash in the very last step is still pending
    pending = bool(h.history) and h.history[-1][0] == "crash"
    found = ran.count("crash") - pending
    expected_counted = ran.count("transient") + (found if on_stuck == "retry" else 0)
    assert h.counted == expected_counted, (h.history, h.counted, expected_counted)
    rec = h.handler.get_record(operation=OP, tenant=TENANT, key=KEY)
    status = rec.status if rec else None
    if "success" in ran:
        assert status is Status.SUCCESS and rec is not None and rec.response == h.fresh[0]
        assert ran[-1] == "success"
    elif (
        "permanent" in ran
        or expected_counted >= max_retries
        or (on_stuck == "fail" and found > 0)
    ):
        assert status is Status.FAILED
    elif pending:
        assert status is Status.PROCESSING
    else:
        assert status is None, "a scope whose failures were all transient is released"


# -- 2. canonical hashing ---------------------------------------------------------------------------
def request_hash(handler: IdempotencyHandler, payload: Any) -> str:
    call = handler._engine.prepare(OP, TENANT, KEY, payload, True)
    assert call is not None
    return call.request_hash


@pytest.fixture(scope="module")
def hasher() -> IdempotencyHandler:
    return IdempotencyHandler(MemoryStore(), metrics=None)


def norm(value: Any) -> Any:
    """What the canonical form distinguishes: types (bool ≠ int ≠ float), exact values
    (-0.0 ≠ 0.0), sequences whatever their Python type, dicts whatever their order."""
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, list | tuple):
        return ("list", tuple(norm(v) for v in value))
    assert isinstance(value, dict)
    return ("dict", tuple(sorted((k, norm(v)) for k, v in value.items())))


def reshaped(value: Any, rnd: random.Random) -> Any:
    """The same value with every dict's insertion order shuffled and lists/tuples swapped."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reshaped(v, rnd) for k, v in items}
    if isinstance(value, list | tuple):
        seq = [reshaped(v, rnd) for v in value]
        return tuple(seq) if rnd.random() < 0.5 else seq
    return value


def mutated(value: Any, rnd: random.Random) -> Any:
    """A value that differs from ``value`` in exactly one small place."""
    if isinstance(value, dict):
        if not value or rnd.random() < 0.25:
            return {**value, "".join(value) + "+": None}
        key = rnd.choice(sorted(value))
        if rnd.random() < 0.25:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: mutated(value[key], rnd)}
    if isinstance(value, list | tuple):
        seq = list(value)
        if not seq or rnd.random() < 0.25:
            return [*seq, None]
        i = rnd.randrange(len(seq))
        seq[i] = mutated(seq[i], rnd)
        return seq
    return mutated_scalar(value, rnd)


def mutated_scalar(value: Any, rnd: random.Random) -> Any:
    if value is None:
        return rnd.choice([False, 0, 0.0, "", []])
    if isinstance(value, bool):
        return rnd.choice([not value, int(value), float(value), str(value).lower()])
    if isinstance(value, int):
        return rnd.choice([value + 1, float(value), str(value)])
    if isinstance(value, float):
        up = math.nextafter(value, math.inf)
        nearest = up if math.isfinite(up) else math.nextafter(value, 0.0)
        return rnd.choice([nearest, -value, str(value)])  # -0.0 differs from 0.0 too
    assert isinstance(value, str)
    return rnd.choice([value + "x", value.upper() + "\u00e9", value[:-1] if value else None])


@PROPERTY_SETTINGS
@given(value=json_values, rnd=st.randoms(use_true_random=False))
def test_key_order_and_tuples_never_change_the_hash(
    hasher: IdempotencyHandler, value: Any, rnd: random.Random
) -> None:
    assert request_hash(hasher, reshaped(value, rnd)) == request_hash(hasher, value)


@PROPERTY_SETTINGS
@given(value=json_values, rnd=st.randoms(use_true_random=False))
def test_a_different_value_always_changes_the_hash(
    hasher: IdempotencyHandler, value: Any, rnd: random.Random
) -> None:
    other = mutated(value, rnd)
    assert norm(other) != norm(value), (value, other)  # the generator really changed it
    assert request_hash(hasher, other) != request_hash(hasher, value), (value, other)


@PROPERTY_SETTINGS
@given(a=json_values, b=json_values)
def test_hashes_are_equal_exactly_when_values_are(
    hasher: IdempotencyHandler, a: Any, b: Any
) -> None:
    assert (request_hash(hasher, a) == request_hash(hasher, b)) == (norm(a) == norm(b))


@settings(PROPERTY_SETTINGS, max_examples=100)
@given(value=json_values, rnd=st.randoms(use_true_random=False))
def test_redelivery_with_reshaped_payload_replays_and_changed_payload_conflicts(
    value: Any, rnd: random.Random
) -> None:
    """End to end: a reshaped payload is the same request (replayed, not re-run); a changed
    one is refused with KEY_REUSED_WITH_DIFFERENT_REQUEST."""
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    calls: list[int] = []

    def body() -> Any:
        calls.append(1)
        return value

    def run(payload: Any) -> Any:
        return handler.execute(body, operation=OP, tenant=TENANT, key=KEY, payload=payload)

    first = run(value)
    assert first == roundtrip(value)
    assert run(reshaped(value, rnd)) == first
    with pytest.raises(IdempotencyError) as ei:
        run(mutated(value, rnd))
    assert ei.value.code == ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST
    assert calls == [1]
