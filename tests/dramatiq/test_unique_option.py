"""``unique=True`` on a :class:`UniqueActor`: ``send`` / ``send_with_options`` publish as
``enqueue_unique`` does, on a real RabbitMQ broker (a private vhost, publisher confirms on)
with an in-process ``dramatiq.Worker`` and the Redis store.

Messages for ``held_*`` queues stay unconsumed (the worker reads ``default`` only), so the
broker's count is what was enqueued; a blocker holds the worker's one thread so a message
stays pending until the test lets it go.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler
from idempotent_tasks.dramatiq import IdempotencyMiddlewareError, UniqueActor, idempotent_actor
from tests._wait import budget

from ._unique_env import TENANT, WAIT, UniqueEnv, key, running_env, wait_for


class Env(UniqueEnv):
    def held(self, **options: Any) -> tuple[Any, str]:
        """A UniqueActor on a queue no worker consumes, and that queue."""
        queue = f"held_{uuid.uuid4().hex[:8]}"
        actor = dramatiq.actor(_noop, actor_class=UniqueActor, broker=self.broker,
                               actor_name=queue, queue_name=queue, **options)
        self.broker.declare_queue(queue, ensure=True)
        return actor, queue


def _noop(k: str = "") -> None:
    return None


def _own_key(k: str = "") -> str:
    return k


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_env("dramatiq_unique_option", _declare_actors) as e:
        yield e


def _declare_actors(broker: RabbitmqBroker, handler: IdempotencyHandler, prefix: str) -> Env:
    e = Env(broker, handler, prefix)

    def flaky(k: str) -> None:
        e.runs[k] += 1
        if e.runs[k] == 1:
            raise RuntimeError("transient")

    unique: dict[str, Any] = {"actor_class": UniqueActor, "unique": True, "key": _own_key,
                              "tenant": TENANT}
    e.actors["gated"] = dramatiq.actor(e.gated, broker=e.broker, actor_name="uo_gated", **unique)
    e.actors["flaky"] = dramatiq.actor(
        flaky, broker=e.broker, actor_name="uo_flaky", unique_until="finish", min_backoff=10,
        max_backoff=20, **unique)
    return e


def test_two_sends_enqueue_once_and_return_the_pending_message(env: Env) -> None:
    held, queue = env.held(unique=True, key=_own_key, tenant=TENANT)
    k = key()
    first = held.send(k)
    again = held.send_with_options(args=(k,))
    assert again.message_id == first.message_id
    assert env.queued(queue) == 1
    assert env.mark(held, k) is not None  # the mark's key is the message's idempotency key


def test_send_returns_the_pending_message_until_it_starts(env: Env) -> None:
    gated, k, blocker = env.actors["gated"], key(), key()
    gated.send_with_options(args=(blocker,), unique=False)
    assert env.started[blocker].wait(budget(WAIT))
    first = gated.send(k)
    assert gated.send(k).message_id == first.message_id
    env.gates[blocker].set()
    assert env.started[k].wait(budget(WAIT))  # started: released ("start" is the default)
    second = gated.send(k)
    assert second.message_id != first.message_id
    env.gates[k].set()
    wait_for(lambda: env.runs[k] == 2, "both messages to run")


def test_a_retry_is_not_blocked_by_the_mark(env: Env) -> None:
    """Retries re-enqueues the failed message while its mark (``"finish"``) still holds."""
    flaky, k = env.actors["flaky"], key()
    first = flaky.send(k)
    wait_for(lambda: env.runs[k] == 2, "the retry to run")
    wait_for(lambda: env.mark(flaky, k) is None, "the mark's release after the retry")
    assert flaky.send(k).message_id != first.message_id


def test_unique_false_per_call_enqueues(env: Env) -> None:
    held, queue = env.held(unique=True, key=_own_key, tenant=TENANT)
    k = key()
    first = held.send(k)
    opted_out = held.send_with_options(args=(k,), unique=False)
    assert opted_out.message_id != first.message_id
    assert env.queued(queue) == 2


def test_per_call_options_name_the_scope(env: Env) -> None:
    held, queue = env.held()  # not unique by default, no key= function
    k = key()
    first = held.send_with_options(args=("x",), unique=True, idempotency_key=k, tenant=TENANT)
    again = held.send_with_options(args=("y",), unique=True, idempotency_key=k, tenant=TENANT,
                                   unique_until="finish")
    assert again.message_id == first.message_id
    assert held.send("x").message_id != first.message_id  # the actor's default: off
    assert env.mark(held, k) is not None
    assert env.queued(queue) == 2


def test_a_unique_send_without_a_key_is_a_configuration_error(env: Env) -> None:
    held, queue = env.held(unique=True, tenant=TENANT)
    with pytest.raises(ConfigurationError) as raised:
        held.send("x")
    assert raised.value.code == ErrorCode.CONFIGURATION_ERROR
    assert "idempotency_key" in str(raised.value)
    tenantless, other = env.held(unique=True, key=_own_key)
    with pytest.raises(ConfigurationError, match="tenant"):
        tenantless.send("x")
    assert env.queued(queue) == 0
    assert env.queued(other) == 0


def test_unique_on_an_actor_that_would_ignore_it_is_refused(env: Env) -> None:
    queue = f"held_{uuid.uuid4().hex[:8]}"
    with pytest.raises(IdempotencyMiddlewareError, match="UniqueActor"):
        dramatiq.actor(_noop, broker=env.broker, actor_name=queue, queue_name=queue,
                       unique=True)
    plain = dramatiq.actor(_noop, broker=env.broker, actor_name=queue, queue_name=queue)
    env.broker.declare_queue(queue, ensure=True)
    with pytest.raises(IdempotencyMiddlewareError, match="UniqueActor"):
        plain.send_with_options(args=("x",), unique=True, idempotency_key=key())
    assert env.queued(queue) == 0


def test_the_options_are_checked(env: Env) -> None:
    with pytest.raises(ConfigurationError, match="unique_until"):
        env.held(unique=True, unique_until="end")
    held, _ = env.held(key=_own_key, tenant=TENANT)
    with pytest.raises(ConfigurationError, match="unique_until"):
        held.send_with_options(args=("x",), unique=True, unique_until="end")


def test_idempotent_actor_is_a_unique_actor(env: Env) -> None:
    queue = f"held_{uuid.uuid4().hex[:8]}"
    actor = idempotent_actor(broker=env.broker, actor_name=queue, queue_name=queue,
                             unique=True, key=_own_key, tenant=TENANT)(_noop)
    k = key()
    assert isinstance(actor, UniqueActor)
    assert actor.send(k).message_id == actor.send(k).message_id
    assert env.queued(queue) == 1
