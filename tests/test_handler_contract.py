"""The production guide's testing checklist, run against every store (memory, SQLite,
PostgreSQL, Redis) and every async store (``AsyncSQLStore``, ``AsyncRedisStore``: there each
call goes through the handler's async face, ``execute_async`` / ``run_many_async`` /
``get_record_async`` …, see ``tests._async_stores.HandlerFacade``).  Race windows are forced
with events, never with sleeps."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import (
    ErrorCode,
    IdempotencyError,
    IdempotencyHandler,
    MemoryCache,
    Status,
    current_context,
)
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, FaultyStore

from ._async_stores import (
    ASYNC_STORE_KINDS,
    AsyncFaultyStore,
    HandlerFacade,
    crash,
    is_async,
    loop_of,
)
from .conftest import STORE_KINDS, store_of_kind


class ValidationError(Exception):
    pass


class Flaky(Exception):
    pass


@pytest.fixture(params=STORE_KINDS + ASYNC_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[Any]:
    """A sync store, or an async one living on a loop thread of its own."""
    with store_of_kind(store_kind, tmp_path, "ah") as made:
        yield made


def make_handler(store: Any, clock: FakeClock, **kw: Any) -> Any:
    """The handler (a :class:`HandlerFacade` over it on an async store)."""
    kw.setdefault("metrics", None)
    kw.setdefault("outcome_retry_timeout", 0.2)
    h = IdempotencyHandler(store, clock=clock, lease_timeout=30, ttl=3600, **kw)
    return HandlerFacade(h, loop_of(store)) if is_async(store) else h


def faulty_of(store: Any) -> Any:
    return AsyncFaultyStore(store) if is_async(store) else FaultyStore(store)


@pytest.fixture
def handler(store: Store, clock: FakeClock) -> IdempotencyHandler:
    return make_handler(store, clock)


class Counter:
    def __init__(self, result: Any = "ok") -> None:
        self.calls = 0
        self.result = result

    def __call__(self) -> Any:
        self.calls += 1
        return self.result


def run(h: IdempotencyHandler, fn: Any, key: str = "k1", tenant: str = "acme",
        operation: str = "payments.charge", payload: Any = None, **kw: Any) -> Any:
    return h.execute(fn, operation=operation, tenant=tenant, key=key,
                     payload={"amount": 100} if payload is None else payload, **kw)


class PausedRun:
    """``run(h, body)`` in a thread whose body starts, then waits for ``finish()``: the race
    window is held open with events, not hoped for with sleeps.  The body returns
    ``outcome``, or raises it if it is an exception; ``results`` / ``errors`` get the end."""

    def __init__(self, h: IdempotencyHandler, outcome: Any = "done") -> None:
        started, self._release = threading.Event(), threading.Event()
        self.results: list[Any] = []
        self.errors: list[BaseException] = []

        def body() -> Any:
            started.set()
            assert self._release.wait(10)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        def target() -> None:
            try:
                self.results.append(run(h, body))
            except BaseException as exc:
                self.errors.append(exc)

        self._thread = threading.Thread(target=target)
        self._thread.start()
        assert started.wait(10)

    def finish(self) -> None:
        self._release.set()
        self._thread.join(10)


def code_of(excinfo: pytest.ExceptionInfo[IdempotencyError]) -> str:
    return excinfo.value.code


class Color(enum.Enum):
    RED = "red"


@dataclass
class Receipt:
    id: str
    amount: decimal.Decimal


def test_duplicate_replays_and_body_runs_once(handler: IdempotencyHandler) -> None:
    body = Counter({"charged": True, "n": [1, 2], "at": dt.datetime(2024, 5, 1, 12, 0),
                    "amount": decimal.Decimal("9.99"), "id": uuid.UUID(int=7), "c": Color.RED,
                    "receipt": Receipt("r1", decimal.Decimal("1.00")), "t": (1, 2)})
    fresh = run(handler, body)
    replay = run(handler, body)
    assert body.calls == 1
    assert fresh == replay
    assert fresh["at"] == "2024-05-01T12:00:00" and fresh["amount"] == "9.99"
    assert fresh["c"] == "red" and fresh["receipt"] == {"amount": "1.00", "id": "r1"}
    assert fresh["t"] == [1, 2]


def test_same_key_different_payload_is_409(handler: IdempotencyHandler) -> None:
    run(handler, Counter(), payload={"amount": 100})
    with pytest.raises(IdempotencyError) as ei:
        run(handler, Counter(), payload={"amount": 200})
    assert code_of(ei) == ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST


def test_payload_hash_is_canonical(handler: IdempotencyHandler) -> None:
    body = Counter()
    run(handler, body, payload={"a": 1, "b": [1, 2]})
    run(handler, body, payload={"b": (1, 2), "a": 1})
    assert body.calls == 1


def test_concurrent_duplicate_is_in_progress(handler: IdempotencyHandler) -> None:
    first = PausedRun(handler, "done")
    with pytest.raises(IdempotencyError) as ei:
        run(handler, Counter())
    assert code_of(ei) == ErrorCode.REQUEST_IN_PROGRESS
    with pytest.raises(IdempotencyError) as ei2:  # a different payload still conflicts
        run(handler, Counter(), payload={"other": 1})
    assert code_of(ei2) == ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST
    first.finish()
    assert first.results == ["done"]
    assert run(handler, Counter("x")) == "done"


def test_permanent_failure_poisons(handler: IdempotencyHandler) -> None:
    def bad() -> None:
        raise ValidationError("no")

    with pytest.raises(ValidationError):
        run(handler, bad, permanent=(ValidationError,))
    body = Counter()
    with pytest.raises(IdempotencyError) as ei:
        run(handler, body, permanent=(ValidationError,))
    assert code_of(ei) == ErrorCode.REQUEST_FAILED
    assert body.calls == 0
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.FAILED


def test_permanent_predicate(handler: IdempotencyHandler) -> None:
    def bad() -> None:
        raise ValueError("4xx")

    with pytest.raises(ValueError):
        run(handler, bad, permanent=lambda e: "4xx" in str(e))
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.FAILED


def test_transient_failure_releases_and_reexecutes(handler: IdempotencyHandler) -> None:
    def flaky() -> None:
        raise Flaky()

    with pytest.raises(Flaky):
        run(handler, flaky)
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is None
    body = Counter("second")
    assert run(handler, body) == "second"
    assert body.calls == 1
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.SUCCESS and rec.retry_count == 1


def test_three_transient_failures_poison(handler: IdempotencyHandler) -> None:
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        raise Flaky()

    for _ in range(3):
        with pytest.raises(Flaky):
            run(handler, flaky)
    with pytest.raises(IdempotencyError) as ei:
        run(handler, flaky)
    assert code_of(ei) == ErrorCode.REQUEST_FAILED
    assert calls == 3
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.FAILED and rec.retry_count == 3


def test_per_call_max_retries(handler: IdempotencyHandler) -> None:
    def flaky() -> None:
        raise Flaky()

    with pytest.raises(Flaky):
        run(handler, flaky, max_retries=1)
    with pytest.raises(IdempotencyError) as ei:
        run(handler, flaky, max_retries=1)
    assert code_of(ei) == ErrorCode.REQUEST_FAILED


def test_store_down_fails_closed(store: Store, clock: FakeClock) -> None:
    faulty = faulty_of(store)
    h = make_handler(faulty, clock)
    faulty.fail("create")
    body = Counter()
    with pytest.raises(IdempotencyError) as ei:
        run(h, body)
    assert code_of(ei) == ErrorCode.STORE_UNAVAILABLE
    assert body.calls == 0
    faulty.heal()
    assert run(h, body) == "ok" and body.calls == 1


def test_outcome_not_recorded_keeps_processing_until_lease(store: Store, clock: FakeClock) -> None:
    faulty = faulty_of(store)
    h = make_handler(faulty, clock)
    faulty.fail("mark_success")
    body = Counter()
    with pytest.raises(IdempotencyError) as ei:
        run(h, body)
    assert code_of(ei) == ErrorCode.OUTCOME_NOT_RECORDED
    assert body.calls == 1
    faulty.heal()
    with pytest.raises(IdempotencyError) as ei2:
        run(h, body)
    assert code_of(ei2) == ErrorCode.REQUEST_IN_PROGRESS
    clock.advance(31)
    assert run(h, body) == "ok"
    assert body.calls == 2
    rec = h.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.retry_count == 1


def test_cache_down_still_works(store: Store, clock: FakeClock) -> None:
    class DeadCache:
        name = "dead"

        def get(self, key: str) -> bytes | None:
            raise ConnectionError("down")

        def set(self, key: str, value: bytes, ttl: float) -> None:
            raise ConnectionError("down")

        def delete(self, key: str) -> None:
            raise ConnectionError("down")

    h = make_handler(store, clock, cache=DeadCache())
    body = Counter()
    assert run(h, body) == run(h, body) == "ok"
    assert body.calls == 1


def test_cache_replays_without_store(store: Store, clock: FakeClock) -> None:
    faulty = faulty_of(store)
    h = make_handler(faulty, clock, cache=MemoryCache(clock=clock))
    body = Counter({"v": 1})
    fresh = run(h, body)
    faulty.fail("*")
    assert run(h, body) == fresh
    with pytest.raises(IdempotencyError) as ei:  # a different payload goes to the store
        run(h, body, payload={"x": 1})
    assert code_of(ei) == ErrorCode.STORE_UNAVAILABLE


def test_keys_isolated_per_tenant_and_operation(handler: IdempotencyHandler) -> None:
    results = set()
    for tenant, op in [("acme", "a"), ("globex", "a"), ("acme", "b"), ("acme:a", "x"),
                       ("acme", "a:x")]:
        results.add(run(handler, lambda t=tenant, o=op: f"{t}/{o}", tenant=tenant, operation=op))
    assert len(results) == 5


def test_recovery_unblocks_crashed_key(handler: IdempotencyHandler, clock: FakeClock) -> None:
    crash(handler, operation="payments.charge", tenant="acme", key="k1",
                   payload={"amount": 100})  # a worker claimed it, then died
    assert handler.recover_stuck_records() == 0  # lease still live
    clock.advance(31)
    assert handler.recover_stuck_records() == 1
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is None
    body = Counter()
    assert run(handler, body) == "ok" and body.calls == 1
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.retry_count == 1


def test_recovery_timeout_filters_on_heartbeat(handler: IdempotencyHandler, clock: FakeClock) -> None:
    crash(handler, operation="payments.charge", tenant="acme", key="k1")
    clock.advance(31)
    assert handler.recover_stuck_records(timeout=60) == 0
    clock.advance(30)
    assert handler.recover_stuck_records(timeout=60) == 1


def test_recovery_on_stuck_fail_poisons(store: Store, clock: FakeClock) -> None:
    h = make_handler(store, clock, on_stuck="fail")
    crash(h, operation="payments.charge", tenant="acme", key="k1", payload={"amount": 100})
    clock.advance(31)
    assert h.recover_stuck_records() == 1
    with pytest.raises(IdempotencyError) as ei:
        run(h, Counter())
    assert code_of(ei) == ErrorCode.REQUEST_FAILED


def test_expired_lease_taken_over_counts_and_poisons(handler: IdempotencyHandler, clock: FakeClock) -> None:
    for attempt in range(1, 4):  # three runs, each crashing
        crash(handler, operation="payments.charge", tenant="acme", key="k1",
                       payload={"amount": 100})
        rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
        assert rec is not None and rec.retry_count == attempt - 1
        clock.advance(31)  # the owner crashed
    with pytest.raises(IdempotencyError) as ei:
        run(handler, Counter())  # third crash counted: counter reaches max_retries
    assert code_of(ei) == ErrorCode.REQUEST_FAILED
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.FAILED and rec.retry_count == 3


def test_on_stuck_fail_duplicate_poisons(store: Store, clock: FakeClock) -> None:
    h = make_handler(store, clock)
    crash(h, operation="payments.charge", tenant="acme", key="k1", payload={"amount": 100})
    clock.advance(31)
    body = Counter()
    with pytest.raises(IdempotencyError) as ei:
        run(h, body, on_stuck="fail")
    assert code_of(ei) == ErrorCode.REQUEST_FAILED and body.calls == 0


def test_cleanup_frees_expired_key(handler: IdempotencyHandler, clock: FakeClock) -> None:
    body = Counter()
    run(handler, body)
    assert handler.cleanup_expired_records() == 0
    clock.advance(3601)
    assert handler.get_record(operation="payments.charge", tenant="acme", key="k1") is None
    assert handler.cleanup_expired_records() == 1
    run(handler, body)
    assert body.calls == 2


def test_expired_record_is_replaced_without_cleanup(handler: IdempotencyHandler, clock: FakeClock) -> None:
    body = Counter()
    run(handler, body)
    clock.advance(3601)
    run(handler, body, payload={"another": "payload"})  # expired: counts as absent
    assert body.calls == 2


def test_stale_owner_cannot_overwrite_newer_attempt(handler: IdempotencyHandler, clock: FakeClock) -> None:
    stale = PausedRun(handler, "stale")
    clock.advance(31)  # the first owner is paused past its lease
    assert run(handler, lambda: "fresh") == "fresh"  # takeover
    stale.finish()
    assert stale.results == ["stale"]  # the stale owner gets its body's result back …
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.response == "fresh" and rec.status is Status.SUCCESS
    assert rec.retry_count == 1  # … and writes nothing


def test_stale_owner_failure_is_not_counted_twice(handler: IdempotencyHandler, clock: FakeClock) -> None:
    stale = PausedRun(handler, Flaky())
    clock.advance(31)
    assert run(handler, lambda: "fresh") == "fresh"
    stale.finish()
    assert isinstance(stale.errors[0], Flaky)
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.SUCCESS and rec.retry_count == 1


def test_heartbeat_keeps_long_body_alive(store: Store, clock: FakeClock) -> None:
    beats = threading.Event()
    faulty = faulty_of(store)
    faulty.before["heartbeat"] = beats.set
    h = make_handler(faulty, clock, heartbeat_interval=0.02)
    long = PausedRun(h, "long")
    clock.advance(25)
    for _ in range(2):  # the second beat surely read the clock after the advance
        beats.clear()
        assert beats.wait(5)  # so a renewal at now=+25 happened …
    scope = h._engine.prepare("payments.charge", "acme", "k1", {"amount": 100}, True).scope
    rec = loop_of(store).run(store.get(scope)) if is_async(store) else store.get(scope)
    assert rec is not None and rec.lease_expires_at is not None
    clock.advance(10)  # … so at +35 the lease is still live
    with pytest.raises(IdempotencyError) as ei:
        run(h, Counter())
    assert code_of(ei) == ErrorCode.REQUEST_IN_PROGRESS
    long.finish()
    assert long.results == ["long"]
    h.close()


def test_response_not_serializable_poisons(handler: IdempotencyHandler) -> None:
    body = Counter(object())
    with pytest.raises(IdempotencyError) as ei:
        run(handler, body)
    assert code_of(ei) == ErrorCode.RESPONSE_NOT_SERIALIZABLE
    with pytest.raises(IdempotencyError) as ei2:
        run(handler, body)
    assert code_of(ei2) == ErrorCode.REQUEST_FAILED
    assert body.calls == 1


def test_nested_and_threaded_contexts_never_cross(handler: IdempotencyHandler) -> None:
    seen: dict[str, Any] = {}
    assert current_context() is None

    def inner() -> str:
        ctx = current_context()
        assert ctx is not None
        seen["inner"] = (ctx.key, ctx.operation)
        return "inner"

    def outer() -> str:
        ctx = current_context()
        assert ctx is not None
        seen["outer_before"] = ctx.key
        run(handler, inner, key="k-inner", operation="child")
        seen["outer_after"] = current_context().key  # type: ignore[union-attr]
        box: list[Any] = []
        th = threading.Thread(target=lambda: box.append(current_context()))
        th.start()
        th.join()
        seen["thread"] = box[0]
        return "outer"

    run(handler, outer, key="k-outer")
    assert seen == {"outer_before": "k-outer", "inner": ("k-inner", "child"),
                    "outer_after": "k-outer", "thread": None}
    assert current_context() is None


def test_unkeyed_runs_without_dedup(handler: IdempotencyHandler) -> None:
    body = Counter()
    for _ in range(2):
        handler.execute(body, operation="op", tenant=None, key=None, require_key=False)
    assert body.calls == 2


def test_get_record_fields(handler: IdempotencyHandler, clock: FakeClock) -> None:
    run(handler, Counter({"a": 1}))
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None
    assert (rec.tenant, rec.operation, rec.key) == ("acme", "payments.charge", "k1")
    assert rec.status == "SUCCESS" and rec.response == {"a": 1} and rec.retry_count == 0
    assert rec.created_at == clock.now and rec.expires_at == clock.now + 3600
    assert rec.lease_expires_at is None and rec.fencing_token > 0
    assert len(rec.request_hash) == 64


def test_unpoison_resets(handler: IdempotencyHandler) -> None:
    def bad() -> None:
        raise ValidationError()

    with pytest.raises(ValidationError):
        run(handler, bad, permanent=(ValidationError,))
    old = handler.unpoison(operation="payments.charge", tenant="acme", key="k1")
    assert old.status is Status.FAILED
    assert run(handler, Counter()) == "ok"
    with pytest.raises(IdempotencyError) as ei:
        handler.unpoison(operation="payments.charge", tenant="acme", key="k1")
    assert code_of(ei) == ErrorCode.RECORD_NOT_FOUND


def test_execute_in_transaction_refused_on_non_sql(store_kind: str, handler: IdempotencyHandler) -> None:
    if store_kind in ("sqlite", "postgres", "mysql", "async_postgres"):  # SQL stores support it (tests/test_transactional.py)
        assert handler.execute_in_transaction(lambda conn: 1, operation="op", tenant="t", key="k") == 1
        return
    with pytest.raises(IdempotencyError) as ei:
        handler.execute_in_transaction(lambda conn: 1, operation="op", tenant="t", key="k")
    assert code_of(ei) == ErrorCode.CONFIGURATION_ERROR


async def _async_body() -> dict[str, int]:
    return {"async": 1}


def test_execute_async(handler: IdempotencyHandler) -> None:
    import asyncio

    calls = 0

    async def body() -> dict[str, int]:
        nonlocal calls
        calls += 1
        return await _async_body()

    async def main() -> list[Any]:
        return [
            await handler.execute_async(body, operation="op", tenant="t", key="k", payload=1)
            for _ in range(2)
        ]

    ran = handler.loop.run(main()) if isinstance(handler, HandlerFacade) else asyncio.run(main())
    assert ran == [{"async": 1}, {"async": 1}]
    assert calls == 1


def test_context_retry_count_counts_earlier_attempts(handler: IdempotencyHandler) -> None:
    seen: list[int] = []

    def flaky() -> str:
        ctx = current_context()
        assert ctx is not None
        seen.append(ctx.retry_count)
        if len(seen) < 3:
            raise Flaky()
        return "ok"

    for _ in range(2):
        with pytest.raises(Flaky):
            run(handler, flaky)
    assert run(handler, flaky) == "ok"
    assert seen == [0, 1, 2]


def test_owner_paused_past_its_lease_and_released_by_recovery_records_its_result(
    handler: IdempotencyHandler, clock: FakeClock
) -> None:
    """Recovery released the scope while its owner was paused; the owner then finishes: its
    body really ran, so its result is recorded and later deliveries replay it (no re-run)."""
    paused = PausedRun(handler, "ran once")
    clock.advance(31)
    assert handler.recover_stuck_records() == 1  # released, the crashed-looking attempt counted
    paused.finish()
    assert paused.results == ["ran once"]
    rec = handler.get_record(operation="payments.charge", tenant="acme", key="k1")
    assert rec is not None and rec.status is Status.SUCCESS and rec.response == "ran once"
    assert rec.retry_count == 1
    body = Counter("again")
    assert run(handler, body) == "ran once" and body.calls == 0


# -- run_many: a batch's claims (and successes) in one store round trip each -----------------
def _calls(*keys: str) -> list[dict[str, Any]]:
    return [{"operation": "payments.charge", "tenant": "acme", "key": k, "payload": {"amount": 1}}
            for k in keys]


def test_run_many_with_batch_completion_records_every_success_in_one_store_call(
    store: Store, clock: FakeClock
) -> None:
    faulty = faulty_of(store)
    h = make_handler(faulty, clock)
    outcomes = h.run_many(_calls("a", "b", "c"), lambda c: {"key": c["key"], "t": (1, 2)},
                          batch_completion=True)
    assert [o.kind for o in outcomes] == ["executed"] * 3
    assert [o.result for o in outcomes] == [{"key": k, "t": [1, 2]} for k in "abc"]  # replayable
    assert faulty.calls == ["create_many", "mark_success_many"]
    for key in "abc":
        body = Counter()
        assert run(h, body, key=key, payload={"amount": 1}) == {"key": key, "t": [1, 2]}
        assert body.calls == 0


def test_run_many_answers_each_item_on_its_own(store: Store, clock: FakeClock) -> None:
    h = make_handler(store, clock)
    newer: list[int] = []

    def body(c: dict[str, Any]) -> Any:
        if c["key"] == "bad":
            return object()
        if c["key"] == "stale":  # every lease expires; another attempt takes "stale" over
            clock.advance(31)
            newer.append(crash(h, operation="payments.charge", tenant="acme",
                                        key="stale", payload={"amount": 1}))
            return 3
        return 1

    outcomes = h.run_many(_calls("ok", "bad", "stale"), body, batch_completion=True)
    assert [o.kind for o in outcomes] == ["executed", "poisoned", "superseded"]
    assert outcomes[0].result == 1
    assert outcomes[1].error_code is ErrorCode.RESPONSE_NOT_SERIALIZABLE
    assert outcomes[2].result == 3  # a stale owner gets its body's result back, writes nothing
    records = {k: h.get_record(operation="payments.charge", tenant="acme", key=k)
               for k in ("ok", "bad", "stale")}
    assert {k: r.status if r else None for k, r in records.items()} == {
        "ok": Status.SUCCESS, "bad": Status.FAILED, "stale": Status.PROCESSING,
    }
    assert records["stale"] is not None and records["stale"].fencing_token == newer[0]
    assert newer[0] > outcomes[2].fencing_token  # type: ignore[operator]


def test_run_many_with_the_store_down_reports_each_scope_not_recorded(
    store: Store, clock: FakeClock
) -> None:
    faulty = faulty_of(store)
    h = make_handler(faulty, clock)
    faulty.fail("mark_success_many")
    outcomes = h.run_many(_calls("a", "b"), lambda c: 1, batch_completion=True)
    assert [(o.kind, o.error_code, o.key) for o in outcomes] == [
        ("store_unavailable", ErrorCode.OUTCOME_NOT_RECORDED, "a"),
        ("store_unavailable", ErrorCode.OUTCOME_NOT_RECORDED, "b"),
    ]
    faulty.heal()
    assert h.run_many([], lambda c: 1) == []
