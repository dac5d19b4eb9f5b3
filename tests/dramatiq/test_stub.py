"""The Dramatiq integration against StubBroker + a real in-process Worker.

A broker redelivery is the same message enqueued again (same message id); a producer
duplicate is a new message with the same idempotency key.  Race windows are forced with
events: a body blocks until the test has *observed* the duplicate being retried.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import pytest

from idempotent_tasks import ErrorCode, Status, current_context
from idempotent_tasks.dramatiq import (
    IdempotencyMiddlewareError,
    IdempotencyRetry,
    get_context,
    idempotent_actor,
)
from tests._claims import claimed

from .conftest import Env, close_env, make_env

FAST: dict[str, Any] = {"min_backoff": 10, "max_backoff": 40}


class Declined(Exception):
    """A permanent business error."""


def test_duplicate_deliveries_run_the_body_once_and_replay_the_result(env: Env) -> None:
    runs: list[Any] = []

    @idempotent_actor(store_results=True, **FAST)
    def add(x: int, y: int) -> dict[str, int]:
        ctx = current_context()
        assert ctx is not None
        runs.append((ctx.tenant, ctx.operation, ctx.key))
        return {"sum": x + y}

    env.start()
    first = add.send_with_options(args=(1, 2), idempotency_key="k-1", tenant="acme")
    env.join()
    env.redeliver(first)  # broker redelivery: same message id
    second = add.send_with_options(args=(1, 2), idempotency_key="k-1", tenant="acme")
    env.join()

    assert runs == [("acme", "add", "k-1")]
    assert first.get_result(backend=env.backend) == {"sum": 3}
    assert second.get_result(backend=env.backend) == {"sum": 3}  # the replay is its result
    assert [e.kind for e in env.observer.events] == ["done", "skipped", "skipped"]
    assert env.dead_letter_ids() == []
    record = env.handler.get_record(operation="add", tenant="acme", key="k-1")
    assert record is not None and record.status is Status.SUCCESS and record.retry_count == 0


def test_concurrent_duplicate_is_retried_uncounted_then_replayed(env: Env) -> None:
    started = threading.Event()
    release = threading.Event()
    runs: list[int] = []

    @idempotent_actor(store_results=True, **FAST)
    def slow(n: int) -> int:
        runs.append(n)
        started.set()
        assert release.wait(10)
        return n * 10

    env.start(threads=2)
    first = slow.send_with_options(args=(7,), idempotency_key="same", tenant="acme")
    assert started.wait(10)
    dup = slow.send_with_options(args=(7,), idempotency_key="same", tenant="acme")
    # The duplicate must have been refused as in progress (and retried) at least once.
    env.observer.wait_for(lambda ev: any(
        e.message_id == dup.message_id and isinstance(e.exception, IdempotencyRetry)
        and e.exception.code == ErrorCode.REQUEST_IN_PROGRESS for e in ev))
    release.set()
    env.join()

    assert runs == [7]
    assert dup.get_result(backend=env.backend) == 70 == first.get_result(backend=env.backend)
    assert env.dead_letter_ids() == []
    record = env.handler.get_record(operation="slow", tenant="acme", key="same")
    assert record is not None and record.retry_count == 0  # in-progress retries never count


def test_permanent_failure_is_dead_lettered_at_once_and_never_rerun(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(permanent=(Declined,), **FAST)
    def charge(amount: int) -> None:
        runs.append(amount)
        raise Declined("card declined")

    env.start()
    msg = charge.send_with_options(args=(5,), idempotency_key="p-1", tenant="acme")
    env.join()
    env.redeliver(msg)
    env.join()

    assert runs == [5]
    assert env.dead_letter_ids() == [msg.message_id, msg.message_id]
    dead = env.broker.dead_letters
    assert isinstance(dead[0]._exception, Declined)
    ctx = get_context(dead[1])
    assert ctx is not None and ctx.outcome == "poisoned"
    assert getattr(dead[1]._exception, "code", None) == ErrorCode.REQUEST_FAILED
    record = env.handler.get_record(operation="charge", tenant="acme", key="p-1")
    assert record is not None and record.status is Status.FAILED and record.retry_count == 0


def test_transient_failures_are_retried_then_succeed(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(store_results=True, **FAST)
    def flaky() -> str:
        runs.append(1)
        if len(runs) < 3:
            raise ConnectionError("try again")
        return "ok"

    env.start()
    msg = flaky.send_with_options(idempotency_key="t-1", tenant="acme")
    env.join()

    assert len(runs) == 3
    assert msg.get_result(backend=env.backend) == "ok"
    record = env.handler.get_record(operation="flaky", tenant="acme", key="t-1")
    assert record is not None and record.status is Status.SUCCESS and record.retry_count == 2


def test_poisoned_after_store_max_retries_not_dramatiq_retry_limit(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(max_retries=4, **FAST)
    def broken() -> None:
        runs.append(1)
        raise ConnectionError("always")

    env.start()
    # Dramatiq's own max_retries=1 on the message must not end the task first.
    msg = broken.send_with_options(idempotency_key="x-1", tenant="acme", max_retries=1)
    env.join()

    assert len(runs) == 4
    assert env.dead_letter_ids() == [msg.message_id]
    ctx = get_context(env.broker.dead_letters[0])
    assert ctx is not None and ctx.outcome == "poisoned" and ctx.retry_count == 4
    record = env.handler.get_record(operation="broken", tenant="acme", key="x-1")
    assert record is not None and record.status is Status.FAILED and record.retry_count == 4


def test_store_down_never_runs_the_body_and_retries_until_it_is_back(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(**FAST)
    def effect() -> None:
        runs.append(1)

    env.store.fail("create")
    env.start()
    msg = effect.send_with_options(idempotency_key="s-1", tenant="acme")
    env.observer.wait_for(lambda ev: len(env.observer.errors("STORE_UNAVAILABLE")) >= 2)
    assert runs == []
    env.store.heal()
    env.join()

    assert runs == [1]
    assert env.dead_letter_ids() == []
    assert all(isinstance(e.exception, IdempotencyRetry) for e in env.observer.errors())
    record = env.handler.get_record(operation="effect", tenant="acme", key="s-1")
    assert record is not None and record.status is Status.SUCCESS and record.retry_count == 0
    assert msg.message_id in {e.message_id for e in env.observer.events if e.kind == "done"}


def test_outcome_not_recorded_is_never_acked_as_success() -> None:
    env = make_env(handler_kwargs={"outcome_retry_timeout": 0.05, "lease_timeout": 0.3})
    try:
        runs: list[int] = []

        @idempotent_actor(store_results=True, **FAST)
        def write() -> int:
            runs.append(1)
            if len(runs) == 1:
                env.store.fail("mark_success")
            return len(runs)

        env.start()
        msg = write.send_with_options(idempotency_key="o-1", tenant="acme")
        env.observer.wait_for(lambda ev: bool(env.observer.errors("OUTCOME_NOT_RECORDED")))
        env.store.heal()
        env.join()
        # The lease decided: the crashed-like attempt was counted and the body re-ran.
        assert len(runs) == 2
        assert msg.get_result(backend=env.backend) == 2
        record = env.handler.get_record(operation="write", tenant="acme", key="o-1")
        assert record is not None and record.status is Status.SUCCESS and record.retry_count == 1
    finally:
        close_env(env)


def test_tenants_are_isolated(env: Env) -> None:
    runs: list[str] = []

    @idempotent_actor(**FAST)
    def act() -> None:
        ctx = current_context()
        assert ctx is not None and ctx.tenant is not None
        runs.append(ctx.tenant)

    env.start()
    for tenant in ("acme", "globex", "acme"):
        act.send_with_options(idempotency_key="shared", tenant=tenant)
    env.join()
    assert sorted(runs) == ["acme", "globex"]


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"tenant": "acme"}, ErrorCode.MISSING_KEY),
        ({"idempotency_key": "k"}, ErrorCode.MISSING_TENANT),
        ({"idempotency_key": "bad\x00key", "tenant": "acme"}, ErrorCode.INVALID_KEY),
    ],
)
def test_missing_or_invalid_key_or_tenant_is_refused(
    env: Env, options: dict[str, Any], code: ErrorCode
) -> None:
    runs: list[int] = []

    @idempotent_actor(**FAST)
    def act() -> None:
        runs.append(1)

    env.start()
    msg = act.send_with_options(**options)
    env.join()
    assert runs == []
    assert env.dead_letter_ids() == [msg.message_id]  # no retries
    assert getattr(env.broker.dead_letters[0]._exception, "code", None) == code
    ctx = get_context(env.broker.dead_letters[0])
    assert ctx is not None and ctx.outcome == "rejected"


def test_key_reused_with_another_payload_is_dead_lettered(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(**FAST)
    def pay(amount: int) -> None:
        runs.append(amount)

    env.start()
    pay.send_with_options(args=(1,), idempotency_key="r", tenant="acme")
    env.join()
    other = pay.send_with_options(args=(2,), idempotency_key="r", tenant="acme")
    env.join()
    assert runs == [1]
    assert env.dead_letter_ids() == [other.message_id]
    exc = env.broker.dead_letters[0]._exception
    assert getattr(exc, "code", None) == ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST


def test_default_tenant_key_function_and_payload_function() -> None:
    env = make_env(default_tenant="single")
    try:
        runs: list[Any] = []

        @idempotent_actor(key=lambda order_id, note: f"order-{order_id}",
                          payload=lambda order_id, note: {"order": order_id}, **FAST)
        def ship(order_id: int, note: str) -> None:
            ctx = current_context()
            assert ctx is not None
            runs.append((ctx.tenant, ctx.key, note))

        env.start()
        ship.send(1, "first")
        ship.send(1, "notes are not part of the payload")
        env.join()
        # worker threads may take either message first; exactly one of them runs the body
        assert len(runs) == 1 and runs[0][:2] == ("single", "order-1")
    finally:
        close_env(env)


def test_require_key_false_uses_the_message_id(env: Env) -> None:
    runs: list[str] = []

    @idempotent_actor(require_key=False, tenant="acme", **FAST)
    def ping() -> None:
        ctx = current_context()
        assert ctx is not None and ctx.key is not None
        runs.append(ctx.key)

    env.start()
    msg = ping.send()
    env.join()
    env.redeliver(msg)
    ping.send()
    env.join()
    assert len(runs) == 2 and runs[0] == msg.message_id


def test_direct_call_runs_the_plain_function(env: Env) -> None:
    @idempotent_actor(**FAST)
    def double(x: int) -> int:
        assert current_context() is None
        return 2 * x

    assert double(4) == 8


def test_worker_refuses_to_boot_without_retries_middleware() -> None:
    from dramatiq.middleware import Retries

    env = make_env()
    try:
        env.broker.middleware[:] = [m for m in env.broker.middleware if not isinstance(m, Retries)]
        worker = dramatiq.Worker(env.broker, worker_timeout=20)
        with pytest.raises(IdempotencyMiddlewareError):
            worker.start()
        worker.stop()
    finally:
        close_env(env)


def test_maintenance_runs_in_the_worker_and_recovers_a_crashed_claim() -> None:
    env = make_env(maintenance=True, recover_every=0.05, cleanup_every=0.05,
                   handler_kwargs={"lease_timeout": 0.2})
    try:
        runs: list[int] = []

        @idempotent_actor(**FAST)
        def job() -> None:
            runs.append(1)

        # A worker claimed the scope and died (nothing will ever complete it).
        call = env.handler._engine.prepare("job", "acme", "c-1", {"args": [], "kwargs": {}}, True)
        assert call is not None and claimed(env.handler, call)
        env.start()
        runner = env.middleware.maintenance_runner
        deadline = time.monotonic() + 10
        while env.handler.get_record(operation="job", tenant="acme", key="c-1") is not None:
            assert time.monotonic() < deadline, "in-worker maintenance did not recover the claim"
            time.sleep(0.02)  # waiting for an observable state change, bounded
        assert runner.runs["recover"] >= 1
        job.send_with_options(idempotency_key="c-1", tenant="acme")
        env.join()
        assert runs == [1]
        record = env.handler.get_record(operation="job", tenant="acme", key="c-1")
        assert record is not None and record.status is Status.SUCCESS and record.retry_count == 1
        assert env.worker is not None
        env.worker.stop()
        env.worker = None
        assert runner._thread is not None and not runner._thread.is_alive()
    finally:
        close_env(env)


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"idempotency_key": "k\x00nul", "tenant": "acme"}, "INVALID_KEY"),
        ({"idempotency_key": "k" * 300, "tenant": "acme"}, "INVALID_KEY"),
        ({"idempotency_key": "ok", "tenant": "t\x1bansi"}, "INVALID_TENANT"),
        ({"idempotency_key": "ok", "tenant": "x" * 10_000}, "INVALID_TENANT"),
        ({"idempotency_key": "'; DROP TABLE x; --\u202e"}, "MISSING_TENANT"),
    ],
)
def test_malformed_options_from_raw_producers_dead_letter_without_running(
    env: Env, options: dict[str, Any], code: str
) -> None:
    runs: list[Any] = []

    @idempotent_actor(**FAST)
    def charge(order: str) -> None:
        runs.append(order)

    env.start()
    message = charge.send_with_options(args=("o-1",), **options)
    env.join()
    assert runs == []
    assert env.dead_letter_ids() == [message.message_id]  # dead-lettered at once, no retries
    assert [e.message_id for e in env.observer.errors(code)] == [message.message_id]


def test_unserialisable_arguments_dead_letter_without_running(env: Env) -> None:
    runs: list[Any] = []

    @idempotent_actor(**FAST)
    def charge(amount: float) -> None:
        runs.append(amount)

    env.start()
    message = charge.send_with_options(args=(float("inf"),), idempotency_key="k", tenant="acme")
    env.join()
    assert runs == [] and env.dead_letter_ids() == [message.message_id]
    assert [e.message_id for e in env.observer.errors("INVALID_PAYLOAD")] == [message.message_id]


def test_a_first_delivery_costs_two_store_calls(env: Env) -> None:
    """claim + outcome: the context's retry counter is read only if someone asks for it."""

    @idempotent_actor(**FAST)
    def ping(n: int) -> int:
        return n

    env.start()
    env.store.calls.clear()
    ping.send_with_options(args=(1,), idempotency_key="two-calls", tenant="acme")
    env.join()
    assert env.store.calls == ["create", "mark_success"]
