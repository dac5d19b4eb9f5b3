"""``unique=True`` on ``IdempotentTask``: ``delay`` / ``apply_async`` publish as ``enqueue_unique``
does, on a real RabbitMQ broker (publisher confirms on) with a real in-process worker and the
Redis store.

What the broker holds is counted on queues the worker does not consume; a blocker task holds
the worker's one thread so a message stays pending until the test lets it go.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler
from idempotent_tasks.celery import IdempotentTask, idempotent_task

from ._unique_env import TENANT, UniqueEnv, running_env
from .conftest import RESULT_TIMEOUT, key, wait_for


class Env(UniqueEnv):
    def hold_worker(self) -> str:
        blocker = key()
        self.tasks["gated"].apply_async((blocker,), unique=False)
        assert self.started[blocker].wait(RESULT_TIMEOUT)
        return blocker


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_env("unique_option", _declare_tasks) as e:
        yield e


def _own_key(k: str) -> str:
    return k


def _tenant(k: str) -> str:
    return TENANT


def _declare_tasks(app: Celery, handler: IdempotencyHandler, prefix: str) -> Env:
    e = Env(app, handler, prefix)

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
    return e


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


def test_idempotent_task_takes_the_options(env: Env) -> None:
    idempotent_task(name="t.unique_decorated", unique=True, unique_until="finish",
                    unique_lease_timeout=600, key=_own_key, tenant=_tenant)(_own_key)
    task = env.app.tasks["t.unique_decorated"]  # shared: bound to every finalized app
    assert (task.unique, task.unique_until, task.unique_lease_timeout) == (True, "finish", 600)
    k, queue = key(), env.held_queue()
    assert task.apply_async((k,), queue=queue).id == task.apply_async((k,), queue=queue).id
    assert env.queued(queue) == 1
