"""``unique=True`` on ``IdempotentTask``: ``delay`` / ``apply_async`` publish as ``enqueue_unique``
does, on a real RabbitMQ broker (publisher confirms on) with a real in-process worker and the
Redis store.

What the broker holds is counted on queues the worker does not consume; a blocker task holds
the worker's one thread so a message stays pending until the test lets it go.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery, chain

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler, Record, RedisStore
from idempotent_tasks.celery import IdempotentTask, setup
from tests._services import REDIS_URL, require

from .conftest import RESULT_TIMEOUT, Counter, key, new_app, running_worker, wait_for

TENANT = "acme"


@dataclass
class Env:
    app: Celery
    handler: IdempotencyHandler
    tasks: dict[str, Any] = field(default_factory=dict)
    runs: Counter = field(default_factory=Counter)
    started: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))
    gates: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))
    queues: list[str] = field(default_factory=list)

    def mark(self, task: Any, k: str) -> Record | None:
        return self.handler.get_record(operation=f"enqueue:{task.name}", tenant=TENANT, key=k)

    def held_queue(self) -> str:
        """A queue no worker consumes (deleted when the module ends)."""
        queue = f"held_{uuid.uuid4().hex[:8]}"
        self.queues.append(queue)
        return queue

    def queued(self, queue: str) -> int:
        with self.app.connection_for_write() as conn:
            declared = conn.default_channel.queue_declare(queue, durable=True, auto_delete=False)
            return int(declared.message_count)

    def hold_worker(self) -> str:
        blocker = key()
        self.tasks["gated"].apply_async((blocker,), unique=False)
        assert self.started[blocker].wait(RESULT_TIMEOUT)
        return blocker


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    require("redis")
    app = new_app("unique_option", broker_transport_options={"confirm_publish": True})
    store = RedisStore(REDIS_URL, prefix=f"it_{uuid.uuid4().hex[:10]}")
    handler = IdempotencyHandler(store, metrics=None, lease_timeout=30)
    setup(app, handler, beat=False)
    e = Env(app, handler)
    _declare_tasks(e)
    try:
        with running_worker(app, concurrency=1):
            yield e
    finally:
        for gate in e.gates.values():
            gate.set()
        with app.connection_for_write() as conn:
            for queue in e.queues:
                conn.default_channel.queue_delete(queue)
        store.drop_schema()
        store.close()


def _own_key(k: str) -> str:
    return k


def _tenant(k: str) -> str:
    return TENANT


def _declare_tasks(e: Env) -> None:
    app = e.app

    @app.task(base=IdempotentTask, name="t.unique_gated", shared=False, unique=True,
              key=_own_key, tenant=_tenant)
    def gated(k: str) -> str:
        e.runs.hit(k)
        e.started[k].set()
        assert e.gates[k].wait(RESULT_TIMEOUT)
        return k

    @app.task(base=IdempotentTask, name="t.unique_retrying", bind=True, shared=False,
              unique=True, unique_until="finish", key=_own_key, tenant=_tenant)
    def retrying(self: Any, k: str) -> str:
        if e.runs.hit(k) == 1:
            raise self.retry(countdown=0)
        return k

    @app.task(base=IdempotentTask, name="t.unique_keyless", shared=False, unique=True,
              tenant=_tenant)
    def keyless(k: str) -> str:
        return k

    @app.task(base=IdempotentTask, name="t.unique_plain", shared=False, key=_own_key,
              tenant=_tenant)
    def plain(k: str) -> str:
        e.runs.hit(k)
        return k

    e.tasks.update(gated=gated, retrying=retrying, keyless=keyless, plain=plain)


def test_two_calls_publish_once_and_return_the_pending_result(env: Env) -> None:
    gated, k, queue = env.tasks["gated"], key(), env.held_queue()
    first = gated.apply_async((k,), queue=queue)
    again = gated.apply_async((k,), queue=queue)
    assert again.id == first.id
    assert env.queued(queue) == 1
    assert env.mark(gated, k) is not None  # the mark's key is the task's idempotency key


def test_delay_returns_the_pending_messages_result(env: Env) -> None:
    gated, k = env.tasks["gated"], key()
    blocker = env.hold_worker()
    first = gated.delay(k)
    assert gated.delay(k).id == first.id
    env.gates[blocker].set()
    env.gates[k].set()
    assert first.get(timeout=RESULT_TIMEOUT) == k
    assert env.runs[k] == 1


def test_unique_false_per_call_publishes(env: Env) -> None:
    gated, k, queue = env.tasks["gated"], key(), env.held_queue()
    first = gated.apply_async((k,), queue=queue)
    opted_out = gated.apply_async((k,), queue=queue, unique=False)
    assert opted_out.id != first.id
    assert env.queued(queue) == 2


def test_unique_true_per_call_on_a_task_without_the_default(env: Env) -> None:
    plain, k, queue = env.tasks["plain"], key(), env.held_queue()
    first = plain.apply_async((k,), queue=queue, unique=True, unique_until="finish")
    assert plain.apply_async((k,), queue=queue, unique=True).id == first.id
    assert plain.apply_async((k,), queue=queue).id != first.id  # the task's default: off
    assert env.queued(queue) == 2


def test_the_per_call_key_and_tenant_name_the_scope(env: Env) -> None:
    plain, k, queue = env.tasks["plain"], key(), env.held_queue()
    first = plain.apply_async(("x",), queue=queue, unique=True, idempotency_key=k, tenant=TENANT)
    assert plain.apply_async(("y",), queue=queue, unique=True, idempotency_key=k,
                             tenant=TENANT).id == first.id
    assert env.mark(plain, k) is not None
    assert env.queued(queue) == 1


def test_self_retry_is_not_blocked_by_the_mark(env: Env) -> None:
    """The retry is published (same task id) while the first attempt's mark still holds:
    Celery's own publish is never held back, so the task reaches its result."""
    retrying, k = env.tasks["retrying"], key()
    result = retrying.delay(k)
    assert result.get(timeout=RESULT_TIMEOUT) == k
    assert env.runs[k] == 2
    wait_for(lambda: env.mark(retrying, k) is None, RESULT_TIMEOUT, "the mark's release")


def test_a_canvas_member_is_not_blocked_by_the_mark(env: Env) -> None:
    gated, k, queue = env.tasks["gated"], key(), env.held_queue()
    pending = gated.apply_async((k,), queue=queue)
    member = chain(gated.si(k).set(queue=queue), gated.si(k)).apply_async()
    assert member.parent is not None and member.parent.id != pending.id
    assert env.queued(queue) == 2


def test_a_unique_call_without_a_key_is_a_configuration_error(env: Env) -> None:
    keyless, queue = env.tasks["keyless"], env.held_queue()
    with pytest.raises(ConfigurationError) as raised:
        keyless.apply_async(("x",), queue=queue)
    assert raised.value.code == ErrorCode.CONFIGURATION_ERROR
    assert "idempotency_key" in str(raised.value)
    assert env.queued(queue) == 0
    published = keyless.apply_async(("x",), queue=queue, idempotency_key=key())
    assert keyless.apply_async(("x",), queue=queue, unique=False).id != published.id
    assert env.queued(queue) == 2


def test_a_unique_call_without_a_tenant_is_a_configuration_error(env: Env) -> None:
    queue = env.held_queue()

    @env.app.task(base=IdempotentTask, name="t.unique_tenantless", shared=False, unique=True)
    def tenantless(k: str) -> None: ...

    with pytest.raises(ConfigurationError, match="tenant"):
        tenantless.apply_async(("x",), queue=queue, idempotency_key=key())
    assert env.queued(queue) == 0


def test_the_options_are_checked(env: Env) -> None:
    with pytest.raises(ConfigurationError, match="task_id"):
        env.tasks["plain"].apply_async(("x",), unique=True, task_id="mine")
    with pytest.raises(ConfigurationError, match="unique_until"):
        env.tasks["plain"].apply_async(("x",), unique=True, unique_until="end")
    with pytest.raises(ConfigurationError, match="unique_until"):
        env.app.task(base=IdempotentTask, name="t.unique_typo", shared=False, unique=True,
                     unique_until="end")(_own_key)
