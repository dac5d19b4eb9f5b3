"""Celery integration against a real RabbitMQ broker, a real (in-process) worker, a Redis
result backend and the SQL store on SQLite.

Race windows are forced with events: a body blocks until the test saw what it waits for.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group, signals
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from idempotent_tasks import IdempotencyHandler, SQLStore, Status, current_context
from idempotent_tasks._core.records import Scope
from idempotent_tasks.celery import (
    CLEANUP_TASK,
    KEY_HEADER,
    RECOVER_TASK,
    TENANT_HEADER,
    IdempotentTask,
    derive_key,
    idempotent_chain,
    idempotent_task,
    keyed,
    setup,
)
from idempotent_tasks.testing import FaultyStore
from tests._claims import claimed

from .conftest import RESULT_TIMEOUT, Counter, key, new_app, running_worker, wait_for

TENANT = "acme"


class Declined(Exception):
    """A permanent business error."""


@dataclass
class Env:
    app: Celery
    handler: IdempotencyHandler
    store: FaultyStore
    runs: Counter
    tasks: dict[str, Any]
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    seen: list[dict[str, Any]] = field(default_factory=list)
    retries: list[tuple[str, str | None]] = field(default_factory=list)
    retried: threading.Condition = field(default_factory=threading.Condition)

    def record(self, task: Any, k: str, tenant: str = TENANT) -> Any:
        return self.handler.get_record(operation=task.name, tenant=tenant, key=k)

    def wait_retries(self, task_id: str, code: str, count: int = 1) -> None:
        def enough() -> bool:
            return sum(1 for t, c in self.retries if t == task_id and c == code) >= count

        with self.retried:
            assert self.retried.wait_for(enough, timeout=10), self.retries


def _declare(env: Env) -> None:
    app, runs = env.app, env.runs
    fast: dict[str, Any] = {"default_retry_delay": 0.05, "wait_backoff": (0.1, 0.3)}

    @app.task(base=IdempotentTask, shared=False, bind=True, name="t.charge", permanent=(Declined,), **fast)
    def charge(self: IdempotentTask, order: str, amount: int) -> dict[str, Any]:
        runs.hit(f"charge:{order}")
        ctx = current_context()
        env.seen.append({"request": self.request.idempotency, "current": ctx})
        if amount < 0:
            raise Declined("negative amount")
        return {"order": order, "charged": amount}

    @app.task(base=IdempotentTask, shared=False, name="t.flaky", max_retries=5, **fast)
    def flaky(name: str, succeed_on: int) -> str:
        n = runs.hit(f"flaky:{name}")
        if succeed_on and n >= succeed_on:
            return f"ok after {n}"
        raise ConnectionError("gateway timeout")

    @app.task(base=IdempotentTask, shared=False, bind=True, name="t.self_retry", **fast)
    def self_retry(self: IdempotentTask, name: str) -> int:
        n = runs.hit(f"self_retry:{name}")
        scope = Scope(TENANT, "t.self_retry", self.request.headers[KEY_HEADER])
        env.seen.append({"name": name, "counter_at_start": env.store.get_retry_count(scope)})
        if n < 3:
            self.retry(countdown=0.05)
        return n

    @app.task(base=IdempotentTask, shared=False, name="t.slow", **fast)
    def slow(name: str) -> str:
        runs.hit(f"slow:{name}")
        env.started.set()
        assert env.release.wait(15)
        return f"slow {name}"

    @app.task(base=IdempotentTask, shared=False, name="t.signal", **fast)
    def signal(kind: str, name: str) -> None:
        runs.hit(f"signal:{name}")
        if kind == "reject":
            raise Reject("bad message", requeue=False)
        if kind == "ignore":
            raise Ignore()
        raise SoftTimeLimitExceeded()

    @idempotent_task(
        name="t.by_args", key=lambda order, amount: f"order-{order}",
        tenant=lambda order, amount: f"tenant-{order % 2}", **fast,
    )
    def by_args(order: int, amount: int) -> int:
        runs.hit(f"by_args:{order}")
        return order * amount

    @idempotent_task(name="t.step", bind=True, **fast)
    def step(self: IdempotentTask, value: int, add: int) -> int:
        runs.hit(f"step:{self.request.headers[KEY_HEADER]}")
        return value + add

    @idempotent_task(name="t.total", bind=True, **fast)
    def total(self: IdempotentTask, values: list[int]) -> int:
        runs.hit(f"total:{self.request.headers[KEY_HEADER]}")
        return sum(values)

    env.tasks.update(
        charge=charge, flaky=flaky, self_retry=self_retry, slow=slow, signal=signal,
        by_args=by_args, step=step, total=total,
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('celery') / 'idem.db'}")
    store.create_schema()
    faulty = FaultyStore(store)
    handler = IdempotencyHandler(faulty, metrics=None, lease_timeout=30)  # type: ignore[arg-type]
    app = new_app("worker")
    setup(app, handler)
    env = Env(app, handler, faulty, Counter(), {})
    _declare(env)

    def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        with env.retried:
            code = getattr(getattr(reason, "exc", None), "code", None)  # reason is a Retry
            env.retries.append((request.id, code))
            env.retried.notify_all()

    signals.task_retry.connect(on_retry, weak=False)
    try:
        with running_worker(app):
            yield env
    finally:
        signals.task_retry.disconnect(on_retry)
        handler.close()
        store.close()


def get(result: Any) -> Any:
    return result.get(timeout=RESULT_TIMEOUT, disable_sync_subtasks=False)


def failure(result: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        get(result)
    assert result.state == "FAILURE"
    return info.value


# ---------------------------------------------------------------------- duplicates, tenants
def test_duplicates_replay_the_stored_result(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    first = get(charge.apply_async(("o-1", 100), idempotency_key=k, tenant=TENANT))
    dups = [charge.apply_async(("o-1", 100), idempotency_key=k, tenant=TENANT) for _ in range(3)]
    assert [get(r) for r in dups] == [first] * 3
    assert all(r.state == "SUCCESS" for r in dups)
    assert env.runs["charge:o-1"] == 1
    record = env.record(charge, k)
    assert record.status is Status.SUCCESS and record.response == first


def test_tenants_never_share_a_scope(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    get(charge.apply_async(("o-2", 5), idempotency_key=k, tenant="tenant-a"))
    get(charge.apply_async(("o-2", 5), idempotency_key=k, tenant="tenant-b"))
    get(charge.apply_async(("o-2", 5), idempotency_key=k, tenant="tenant-b"))
    assert env.runs["charge:o-2"] == 2
    assert env.record(charge, k, "tenant-a").status is Status.SUCCESS
    assert env.record(charge, k, "tenant-b").status is Status.SUCCESS


def test_same_key_other_payload_is_refused(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    get(charge.apply_async(("o-3", 1), idempotency_key=k, tenant=TENANT))
    err = failure(charge.apply_async(("o-3", 2), idempotency_key=k, tenant=TENANT))
    assert err.code == "KEY_REUSED_WITH_DIFFERENT_REQUEST"
    assert env.runs["charge:o-3"] == 1


def test_context_on_request_and_current_context(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    env.seen.clear()
    get(charge.apply_async(("o-ctx", 1), idempotency_key=k, tenant=TENANT))
    (seen,) = env.seen
    assert seen["request"] is seen["current"]
    assert (seen["current"].tenant, seen["current"].operation, seen["current"].key) == (
        TENANT, "t.charge", k,
    )
    assert seen["current"].outcome == "executed"  # updated once the body returned


# ---------------------------------------------------------------------- failures
def test_permanent_failure_poisons_and_is_never_rerun(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    err = failure(charge.apply_async(("o-4", -1), idempotency_key=k, tenant=TENANT))
    assert isinstance(err, Declined)
    assert env.record(charge, k).status is Status.FAILED
    again = failure(charge.apply_async(("o-4", -1), idempotency_key=k, tenant=TENANT))
    assert again.code == "REQUEST_FAILED"
    assert env.runs["charge:o-4"] == 1


def test_transient_failures_are_retried_then_succeed(env: Env) -> None:
    flaky, k = env.tasks["flaky"], key()
    assert get(flaky.apply_async(("recovers", 3), idempotency_key=k, tenant=TENANT)) == (
        "ok after 3"
    )
    record = env.record(flaky, k)
    assert record.status is Status.SUCCESS and record.retry_count == 2


def test_retry_that_cannot_be_published_requeues_the_message(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery rejects the message *without* requeue when publishing a retry fails; the
    integration requeues it instead, so a released scope is never left without a message."""
    flaky, k = env.tasks["flaky"], key()
    task_type = type(flaky._get_current_object())
    original = task_type.apply_async
    failed: list[str] = []

    def broker_down_once(self: Any, *args: Any, **options: Any) -> Any:
        if options.get("retries") and not failed:  # the retry's publish, once
            failed.append("retry publish")
            raise ConnectionError("broker connection lost while publishing the retry")
        return original(self, *args, **options)

    monkeypatch.setattr(task_type, "apply_async", broker_down_once)
    assert get(flaky.apply_async(("unpublished", 2), idempotency_key=k, tenant=TENANT)) == (
        "ok after 2"
    )
    assert failed == ["retry publish"]
    assert env.runs["flaky:unpublished"] == 2  # the requeued original ran again, once
    assert env.record(flaky, k).retry_count == 1


def test_poisoned_after_the_stores_max_retries_not_celerys(env: Env) -> None:
    # max_retries=5 on the task: more runs than Celery's own default limit (3 retries) allows.
    flaky, k = env.tasks["flaky"], key()
    err = failure(flaky.apply_async(("always", 0), idempotency_key=k, tenant=TENANT))
    assert isinstance(err, ConnectionError)
    assert env.runs["flaky:always"] == 5
    record = env.record(flaky, k)
    assert record.status is Status.FAILED and record.retry_count == 5
    assert failure(flaky.apply_async(("always", 0), idempotency_key=k, tenant=TENANT)).code == (
        "REQUEST_FAILED"
    )
    assert env.runs["flaky:always"] == 5


def test_self_retry_is_counted_before_the_retry_is_published(env: Env) -> None:
    task, k = env.tasks["self_retry"], key()
    env.seen.clear()
    assert get(task.apply_async(("sr",), idempotency_key=k, tenant=TENANT)) == 3
    counters = [s["counter_at_start"] for s in env.seen if s.get("name") == "sr"]
    assert counters == [0, 1, 2]
    assert env.record(task, k).retry_count == 2


@pytest.mark.parametrize(("kind", "status"), [("reject", Status.FAILED), ("ignore", Status.FAILED)])
def test_reject_and_ignore_are_permanent(env: Env, kind: str, status: Status) -> None:
    task, k = env.tasks["signal"], key()
    task.apply_async((kind, f"{kind}-{k}"), idempotency_key=k, tenant=TENANT)
    wait_for(lambda: env.record(task, k) is not None, what="the poisoned record")
    record = env.record(task, k)
    assert record.status is status and record.retry_count == 0
    assert env.runs[f"signal:{kind}-{k}"] == 1


def test_soft_time_limit_is_transient(env: Env) -> None:
    task, k = env.tasks["signal"], key()
    err = failure(task.apply_async(("soft", "soft"), idempotency_key=k, tenant=TENANT))
    assert isinstance(err, SoftTimeLimitExceeded)
    assert env.runs["signal:soft"] == 3  # counted and retried up to the handler's max_retries
    assert env.record(task, k).retry_count == 3


# ---------------------------------------------------------------------- refused input
def test_missing_key_is_refused_without_running(env: Env) -> None:
    charge = env.tasks["charge"]
    err = failure(charge.apply_async(("o-nokey", 1), tenant=TENANT))
    assert err.code == "MISSING_KEY"
    assert env.runs["charge:o-nokey"] == 0


def test_missing_tenant_is_refused_without_running(env: Env) -> None:
    charge = env.tasks["charge"]
    err = failure(charge.apply_async(("o-notenant", 1), idempotency_key=key()))
    assert err.code == "MISSING_TENANT"
    assert env.runs["charge:o-notenant"] == 0


def test_key_and_tenant_from_arguments_with_delay(env: Env) -> None:
    by_args = env.tasks["by_args"]
    results = [get(by_args.delay(7, 3)) for _ in range(3)]
    assert results == [21] * 3
    assert env.runs["by_args:7"] == 1
    assert env.handler.get_record(operation="t.by_args", tenant="tenant-1", key="order-7")


def test_raw_header_producer(env: Env) -> None:
    k = key()
    headers = {KEY_HEADER: k, TENANT_HEADER: TENANT}
    results = [
        env.app.send_task("t.charge", args=("o-raw", 9), headers=headers) for _ in range(2)
    ]
    assert [get(r) for r in results] == [{"order": "o-raw", "charged": 9}] * 2
    assert env.runs["charge:o-raw"] == 1


# ---------------------------------------------------------------------- waiting
def test_in_progress_duplicate_is_retried_then_replayed(env: Env) -> None:
    slow, k = env.tasks["slow"], key()
    env.started.clear()
    env.release.clear()
    first = slow.apply_async(("a",), idempotency_key=k, tenant=TENANT)
    assert env.started.wait(10)
    dup = slow.apply_async(("a",), idempotency_key=k, tenant=TENANT)
    env.wait_retries(dup.id, "REQUEST_IN_PROGRESS")  # the window is held open by `release`
    assert env.record(slow, k).status is Status.PROCESSING
    env.release.set()
    assert get(first) == get(dup) == "slow a"
    assert env.runs["slow:a"] == 1
    assert env.record(slow, k).retry_count == 0  # waiting is never counted as a failure


def test_redelivered_copy_of_a_running_task_id_sees_in_progress(env: Env) -> None:
    slow, k = env.tasks["slow"], key()
    env.started.clear()
    env.release.clear()
    first = slow.apply_async(("b",), idempotency_key=k, tenant=TENANT)
    assert env.started.wait(10)
    slow.apply_async(("b",), idempotency_key=k, tenant=TENANT, task_id=first.id)  # redelivery
    env.wait_retries(first.id, "REQUEST_IN_PROGRESS")
    env.release.set()
    assert get(first) == "slow b"
    assert env.runs["slow:b"] == 1


def test_store_down_retries_and_never_runs_the_body(env: Env) -> None:
    charge, k = env.tasks["charge"], key()
    env.store.fail("create")
    try:
        result = charge.apply_async(("o-down", 1), idempotency_key=k, tenant=TENANT)
        env.wait_retries(result.id, "STORE_UNAVAILABLE", count=2)
        assert env.runs["charge:o-down"] == 0
    finally:
        env.store.heal()
    assert get(result) == {"order": "o-down", "charged": 1}
    assert env.runs["charge:o-down"] == 1
    assert env.record(charge, k).retry_count == 0


# ---------------------------------------------------------------------- canvases
def test_chain_steps_get_derived_keys_and_a_resent_chain_reruns_nothing(env: Env) -> None:
    step, k = env.tasks["step"], key()

    def canvas() -> Any:
        return idempotent_chain(k, step.s(1, 1), step.s(10), step.s(100), tenant=TENANT)

    assert get(canvas().apply_async()) == 112
    keys = [derive_key(k, "t.step", str(i)) for i in range(3)]
    assert [env.runs[f"step:{dk}"] for dk in keys] == [1, 1, 1]
    assert get(canvas().apply_async()) == 112  # the whole canvas sent again
    assert [env.runs[f"step:{dk}"] for dk in keys] == [1, 1, 1]


def test_group_and_chord_members_get_positional_keys(env: Env) -> None:
    step, total, k = env.tasks["step"], env.tasks["total"], key()

    def canvas() -> Any:
        return keyed(chord(group(step.s(i, 1) for i in range(3)), total.s()), k, tenant=TENANT)

    assert get(canvas().apply_async()) == 6
    assert get(canvas().apply_async()) == 6
    members = [derive_key(k, "t.step", str(i)) for i in range(3)]
    assert [env.runs[f"step:{m}"] for m in members] == [1, 1, 1]
    assert env.runs[f"total:{derive_key(k, 't.total', 'body')}"] == 1
    # the same member in another position is another scope
    assert len({*members, derive_key(k, "t.total", "body")}) == 4


def test_keyed_keeps_explicit_keys_and_does_not_mutate() -> None:
    app = Celery("canvas_only", set_as_current=False)
    original = chain(app.signature("x.a", (1,)), app.signature("x.b").set(
        headers={KEY_HEADER: "mine"}))
    out = keyed(original, "root")
    assert out.tasks[0].options["headers"][KEY_HEADER] == derive_key("root", "x.a", "0")
    assert out.tasks[1].options["headers"][KEY_HEADER] == "mine"
    assert "headers" not in original.tasks[0].options
    assert derive_key("a:b", "c", "0") != derive_key("a", "b:c", "0")


# ---------------------------------------------------------------------- maintenance
def test_beat_entries_and_maintenance_tasks(env: Env) -> None:
    schedule = env.app.conf.beat_schedule
    assert schedule[RECOVER_TASK]["task"] == RECOVER_TASK
    assert schedule[RECOVER_TASK]["schedule"] == 300.0
    assert schedule[CLEANUP_TASK]["task"] == CLEANUP_TASK
    assert schedule[CLEANUP_TASK]["schedule"] == 3600.0
    # a claimed scope whose worker died: its lease is already over
    h, k = env.handler, key()
    call = h._engine.prepare("t.charge", TENANT, k, {"args": ["o-stuck", 1], "kwargs": {}}, True,
                             {"lease_timeout": 0.01})
    assert call is not None
    claimed(h, call)
    wait_for(lambda: h.clock() > env.record(env.tasks["charge"], k).lease_expires_at)
    assert get(env.app.send_task(RECOVER_TASK)) >= 1
    assert env.record(env.tasks["charge"], k) is None
    assert env.store.get_retry_count(call.scope) == 1
    # the redelivered task now runs once, its crashed attempt counted
    get(env.tasks["charge"].apply_async(("o-stuck", 1), idempotency_key=k, tenant=TENANT))
    assert env.record(env.tasks["charge"], k).retry_count == 1
    assert isinstance(get(env.app.send_task(CLEANUP_TASK)), int)


def test_cleanup_task_purges_expired_records(tmp_path: Path, env: Env) -> None:
    h, k = env.handler, key()
    h.execute(lambda: 1, operation="t.expiring", tenant=TENANT, key=k, ttl=0.01)
    record = h._engine.store.get(Scope(TENANT, "t.expiring", k))
    wait_for(lambda: h.clock() > record.expires_at)
    assert get(env.app.send_task(CLEANUP_TASK)) >= 1
    assert h._engine.store.get(Scope(TENANT, "t.expiring", k)) is None


# ---------------------------------------------------------------------- hostile input
@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({KEY_HEADER: "k\x00nul", TENANT_HEADER: TENANT}, "INVALID_KEY"),
        ({KEY_HEADER: "k" * 300, TENANT_HEADER: TENANT}, "INVALID_KEY"),
        ({KEY_HEADER: "", TENANT_HEADER: TENANT}, "MISSING_KEY"),
        ({KEY_HEADER: "ok", TENANT_HEADER: "t\x1bansi"}, "INVALID_TENANT"),
        ({KEY_HEADER: "ok", TENANT_HEADER: "x" * 10_000}, "INVALID_TENANT"),
        ({KEY_HEADER: "'; DROP TABLE x; --\u202e", TENANT_HEADER: ""}, "MISSING_TENANT"),
    ],
)
def test_malformed_headers_from_raw_producers_fail_without_running(
    env: Env, headers: dict[str, str], code: str
) -> None:
    order = f"o-hostile-{uuid.uuid4().hex[:6]}"
    result = env.app.send_task("t.charge", args=(order, 1), headers=headers)
    err = failure(result)
    assert err.code == code
    assert env.runs[f"charge:{order}"] == 0


def test_unserialisable_arguments_are_refused(env: Env) -> None:
    order = f"o-nan-{uuid.uuid4().hex[:6]}"
    err = failure(env.tasks["charge"].apply_async((order, float("nan")), idempotency_key=key(),
                                                  tenant=TENANT))
    assert err.code == "INVALID_PAYLOAD"
    assert env.runs[f"charge:{order}"] == 0


def test_a_first_delivery_costs_two_store_calls(env: Env) -> None:
    """claim + outcome: the context's retry counter is read only if someone asks for it."""
    charge, k = env.tasks["charge"], key()
    env.store.calls.clear()
    assert get(charge.apply_async(("o-two-calls", 5), idempotency_key=k, tenant=TENANT))
    assert env.store.calls == ["create", "mark_success"]
