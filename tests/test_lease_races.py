"""Lease races, forced deterministically, against every store.

Every window is opened with events, barriers or a turnstile in a ``FaultyStore`` hook, and
time only moves when the test moves the :class:`FakeClock` — no sleep hopes for a window:

* a worker paused past its lease while another takes over is fenced off when it finishes:
  its write is refused, it logs and counts ``lease_lost``, and the new owner's attempt stands;
* recovery running in two threads at once handles each stuck record exactly once;
* a real heartbeat thread keeps a long body's lease alive across several lease periods;
* a heartbeat that loses the race to a takeover renews nothing for the stale owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import pytest

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    Status,
    create_logger_adapter,
    current_context,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, FaultyStore
from tests._claims import claimed

OP, TENANT, KEY = "payments.charge", "acme", "k-race"
SCOPE = Scope(TENANT, OP, KEY)
LEASE = 30.0
WAIT = 10.0  # generous upper bound for any event: only reached when the test fails


class Permanent(Exception):
    pass


class Transient(Exception):
    pass


class RecordingMetrics:
    """A ``Metrics`` implementation that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def _add(self, name: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((name, args))

    def of(self, name: str) -> list[tuple[Any, ...]]:
        with self._lock:
            return [args for n, args in self.calls if n == name]

    def duplicate(self, operation: str, status: str) -> None:
        self._add("duplicate", operation, status)

    def cache_hit(self, operation: str) -> None:
        self._add("cache_hit", operation)

    def cache_error(self, cache: str) -> None:
        self._add("cache_error", cache)

    def execution(self, operation: str, outcome: str) -> None:
        self._add("execution", operation, outcome)

    def poisoned(self, operation: str) -> None:
        self._add("poisoned", operation)

    def recovered(self, count: int) -> None:
        self._add("recovered", count)

    def cleaned(self, count: int) -> None:
        self._add("cleaned", count)

    def store_error(self, store: str) -> None:
        self._add("store_error", store)

    def lease_lost(self, operation: str) -> None:
        self._add("lease_lost", operation)

    def store_latency(self, store: str, call: str, seconds: float) -> None:
        self._add("store_latency", store, call)


class LogRecorder:
    """``fn(level, message, fields)`` for ``create_logger_adapter``; an event per message."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._seen: dict[str, threading.Event] = {}

    def __call__(self, level: str, message: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            self.records.append((level, message, dict(fields)))
            event = self._seen.setdefault(message, threading.Event())
        event.set()

    def seen(self, message: str) -> threading.Event:
        with self._lock:
            return self._seen.setdefault(message, threading.Event())

    def named(self, message: str) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return [(lv, f) for lv, m, f in self.records if m == message]


class ResultSpy:
    """Wraps a store and records what each call returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.results: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            self.results.append((name, result))
            return result

        return call


class Turnstile:
    """A ``FaultyStore.before["heartbeat"]`` hook: every heartbeat waits here (after its
    ``now`` was read from the clock) until the test lets exactly one through."""

    def __init__(self) -> None:
        self._arrived = threading.Semaphore(0)
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()

    def __call__(self) -> None:
        if self._open.is_set():
            return
        self._arrived.release()
        self._permits.acquire(timeout=WAIT)

    def arrival(self) -> None:
        assert self._arrived.acquire(timeout=WAIT), "no heartbeat arrived"

    def let_one_through(self) -> None:
        self._permits.release()

    def open(self) -> None:
        self._open.set()
        for _ in range(64):
            self._permits.release()


class Worker:
    """Runs ``handler.execute`` in a thread with a body that stops at ``release``."""

    def __init__(
        self, handler: IdempotencyHandler, result: Any = None,
        outcome: Literal["success", "permanent", "transient"] = "success",
    ) -> None:
        self.handler = handler
        self.started = threading.Event()
        self.release = threading.Event()
        self.token: int | None = None
        self.returned: list[Any] = []
        self.raised: list[BaseException] = []
        self._result, self._outcome = result, outcome
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _body(self) -> Any:
        ctx = current_context()
        self.token = ctx.fencing_token if ctx is not None else None
        self.started.set()
        assert self.release.wait(WAIT)
        if self._outcome == "permanent":
            raise Permanent()
        if self._outcome == "transient":
            raise Transient()
        return self._result

    def _run(self) -> None:
        try:
            self.returned.append(run(self.handler, self._body))
        except BaseException as exc:
            self.raised.append(exc)

    def start(self) -> Worker:
        self._thread.start()
        assert self.started.wait(WAIT), f"the body did not start (raised: {self.raised})"
        return self

    def finish(self) -> None:
        self.release.set()
        self._thread.join(WAIT)
        assert not self._thread.is_alive()


def run(h: IdempotencyHandler, fn: Callable[[], Any], key: str = KEY) -> Any:
    return h.execute(
        fn, operation=OP, tenant=TENANT, key=key, payload={"amount": 100},
        permanent=(Permanent,),
    )


def make_handler(
    store: Any, clock: FakeClock, *, metrics: Any = None, log: LogRecorder | None = None,
    **kw: Any,
) -> IdempotencyHandler:
    kw.setdefault("outcome_retry_timeout", 0.5)
    return IdempotencyHandler(
        store, clock=clock, lease_timeout=LEASE, ttl=3600, metrics=metrics,
        logger=create_logger_adapter(log) if log is not None else None, **kw,
    )


@pytest.fixture
def handlers() -> Iterator[list[IdempotencyHandler]]:
    """Handlers built by a test; their heartbeat threads are stopped at the end."""
    made: list[IdempotencyHandler] = []
    yield made
    for h in made:
        h.close()


# -- 1. a paused worker is fenced off --------------------------------------------------------------
FINAL_WRITE = {"success": "mark_success", "permanent": "mark_failed", "transient": "record_failure"}


@pytest.mark.parametrize("outcome", ["success", "permanent", "transient"])
def test_worker_paused_past_its_lease_is_fenced_off(
    store: Store, clock: FakeClock, outcome: Literal["success", "permanent", "transient"]
) -> None:
    spy = ResultSpy(store)
    metrics_a, metrics_b, log_a = RecordingMetrics(), RecordingMetrics(), LogRecorder()
    worker_a = Worker(make_handler(spy, clock, metrics=metrics_a, log=log_a), "A", outcome)
    worker_b = Worker(make_handler(store, clock, metrics=metrics_b), "B")

    worker_a.start()  # A owns the scope and is paused inside its body …
    clock.advance(LEASE + 1)  # … past its lease
    worker_b.start()  # B takes over (the crashed-looking attempt is counted) and runs
    taken = store.get(SCOPE)
    assert taken is not None and taken.fencing_token == worker_b.token != worker_a.token
    assert store.get_retry_count(SCOPE) == 1

    worker_a.finish()  # A wakes up while B is still running
    if outcome == "success":
        assert worker_a.returned == ["A"]  # its own body's result, written nowhere
    else:
        assert [type(e) for e in worker_a.raised] == [Permanent if outcome == "permanent" else Transient]
    write = FINAL_WRITE[outcome]
    assert [r for name, r in spy.results if name == write] == [None if write == "record_failure" else False]
    assert store.get(SCOPE) == taken, "the stale owner changed the new owner's record"
    assert store.get_retry_count(SCOPE) == 1, "the stale owner's failure was counted"
    assert metrics_a.of("lease_lost") == [(OP,)]
    assert metrics_a.of("poisoned") == []
    lost = log_a.named("lease_lost")
    assert [(lv, f["tenant"], f["operation"], f["key"]) for lv, f in lost] == [
        ("warning", TENANT, OP, KEY)
    ]

    worker_b.finish()
    assert worker_b.returned == ["B"]
    assert metrics_b.of("lease_lost") == []
    rec = worker_b.handler.get_record(operation=OP, tenant=TENANT, key=KEY)
    assert rec is not None and rec.status is Status.SUCCESS and rec.response == "B"
    assert rec.retry_count == 1
    assert run(worker_a.handler, lambda: "again") == "B"  # and A's next delivery replays B


# -- 2. concurrent recovery ------------------------------------------------------------------------
class FirstWriteBarrier:
    """Hook that makes each thread's first write wait until every thread reached its own:
    both recoveries have listed the stuck records before either handles one."""

    def __init__(self, parties: int) -> None:
        self._barrier = threading.Barrier(parties, timeout=WAIT)
        self._local = threading.local()

    def __call__(self) -> None:
        if not getattr(self._local, "passed", False):
            self._local.passed = True
            self._barrier.wait()


@pytest.mark.parametrize("on_stuck", ["retry", "fail"])
def test_concurrent_recovery_handles_each_stuck_record_once(
    store: Store, clock: FakeClock, on_stuck: Literal["retry", "fail"]
) -> None:
    n = 6
    owner = make_handler(store, clock)
    scopes = [Scope(TENANT, OP, f"stuck-{i}") for i in range(n)]
    for s in scopes:  # n workers claimed and died inside their bodies
        call = owner._engine.prepare(OP, TENANT, s.key, {"amount": 100}, True)
        assert call is not None and claimed(owner, call)
    clock.advance(LEASE + 1)

    write = "record_failure" if on_stuck == "retry" else "mark_failed"
    gate = FirstWriteBarrier(2)
    start = threading.Barrier(2, timeout=WAIT)
    metrics = [RecordingMetrics(), RecordingMetrics()]
    logs = [LogRecorder(), LogRecorder()]
    handled: list[int | BaseException] = [-1, -1]

    def recover(i: int) -> None:
        faulty = FaultyStore(store)
        faulty.before[write] = gate
        h = make_handler(faulty, clock, metrics=metrics[i], log=logs[i], on_stuck=on_stuck)
        start.wait()
        try:
            handled[i] = h.recover_stuck_records()
        except BaseException as exc:
            handled[i] = exc

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()

    assert all(isinstance(x, int) for x in handled), handled
    found = [[f["found"] for _, f in log.named("recovery_run")] for log in logs]
    assert found == [[n], [n]], "the race window was not forced: both must see every record"
    assert sum(x for x in handled if isinstance(x, int)) == n
    assert sum(c for m in metrics for (c,) in m.of("recovered")) == n
    for s in scopes:
        rec = store.get(s)
        if on_stuck == "retry":
            assert rec is None and store.get_retry_count(s) == 1, (s.key, rec)
        else:
            assert rec is not None and rec.status is Status.FAILED, (s.key, rec)
            assert store.get_retry_count(s) == 0
    poisoned = sum(len(m.of("poisoned")) for m in metrics)
    assert poisoned == (n if on_stuck == "fail" else 0)


# -- 3. heartbeats -----------------------------------------------------------------------------
def test_heartbeats_keep_a_long_body_alive_across_lease_periods(
    store: Store, clock: FakeClock, handlers: list[IdempotencyHandler]
) -> None:
    turnstile = Turnstile()
    faulty = FaultyStore(store)
    faulty.before["heartbeat"] = turnstile
    beating = make_handler(faulty, clock, heartbeat_interval=0.01)
    other = make_handler(store, clock)
    handlers += [beating, other]
    worker = Worker(beating, "long").start()
    try:
        turnstile.arrival()  # a heartbeat is waiting; it read the clock before we move it
        for _ in range(4):
            clock.advance(25.0)  # 4 × 25 s: far past the first lease (30 s)
            turnstile.let_one_through()  # the waiting beat renews with its old time
            turnstile.arrival()  # the next beat read the clock after our advance …
            turnstile.let_one_through()
            turnstile.arrival()  # … and its renewal is written (a third one waits)
            rec = store.get(SCOPE)
            assert rec is not None and rec.fencing_token == worker.token
            assert rec.status is Status.PROCESSING
            assert rec.updated_at == clock() and rec.lease_expires_at == clock() + LEASE
            with pytest.raises(IdempotencyError) as ei:
                run(other, lambda: "duplicate")
            assert ei.value.code == ErrorCode.REQUEST_IN_PROGRESS
            assert other.recover_stuck_records() == 0  # nothing is stuck
    finally:
        turnstile.open()
    worker.finish()
    assert worker.returned == ["long"]
    assert run(other, lambda: "duplicate") == "long"
    assert store.get_retry_count(SCOPE) == 0


def test_takeover_during_a_heartbeat_renews_nothing_for_the_stale_owner(
    store: Store, clock: FakeClock, handlers: list[IdempotencyHandler]
) -> None:
    turnstile = Turnstile()
    faulty = FaultyStore(store)
    faulty.before["heartbeat"] = turnstile
    log_a, metrics_a = LogRecorder(), RecordingMetrics()
    stale = make_handler(faulty, clock, heartbeat_interval=0.01, log=log_a, metrics=metrics_a)
    fresh = make_handler(store, clock)
    handlers += [stale, fresh]
    worker_a = Worker(stale, "A").start()
    try:
        turnstile.arrival()  # beat 1 waits with the claim time
        clock.advance(LEASE + 1)
        turnstile.let_one_through()  # beat 1: renews to claim time + LEASE, expired already
        turnstile.arrival()  # beat 2 read now = claim + 31 and waits, about to renew …
        clock.advance(1)
        worker_b = Worker(fresh, "B").start()  # … when B takes the expired lease over
        taken = store.get(SCOPE)
        assert taken is not None and taken.fencing_token == worker_b.token != worker_a.token
        refused = log_a.seen("heartbeat_refused")
        turnstile.let_one_through()  # beat 2 runs now, with A's stale token
        assert refused.wait(WAIT), "the stale owner's heartbeat was not refused"
    finally:
        turnstile.open()
    assert store.get(SCOPE) == taken, "a stale heartbeat renewed the new owner's lease"
    with pytest.raises(IdempotencyError) as ei:
        run(make_handler(store, clock), lambda: "duplicate")
    assert ei.value.code == ErrorCode.REQUEST_IN_PROGRESS  # B's own lease, untouched

    worker_a.finish()
    assert worker_a.returned == ["A"] and metrics_a.of("lease_lost") == [(OP,)]
    assert store.get(SCOPE) == taken
    worker_b.finish()
    assert worker_b.returned == ["B"]
    rec = fresh.get_record(operation=OP, tenant=TENANT, key=KEY)
    assert rec is not None and rec.status is Status.SUCCESS and rec.response == "B"
    assert rec.retry_count == 1
