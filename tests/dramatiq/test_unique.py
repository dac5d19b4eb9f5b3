"""Unique enqueue for Dramatiq, on a real RabbitMQ broker (a private vhost, publisher
confirms on) with an in-process ``dramatiq.Worker`` and the Redis store.

Windows are forced with events: a blocker actor holds the worker's one thread, so a message
stays pending (not started) until the test lets it go, and each body waits on its own gate.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import q_name
from dramatiq.middleware import Middleware

from idempotent_tasks import ConfigurationError, IdempotencyHandler
from idempotent_tasks.dramatiq import enqueue_unique
from idempotent_tasks.enqueue import UniqueMark
from tests._race import at_once
from tests._silent_broker import kill_at_its_mark
from tests._wait import budget

from ._unique_env import TENANT, WAIT, UniqueEnv, key, running_env, wait_for


class Settled(Middleware):
    """Counts acks and nacks per message id (acks of a delayed message moved to its queue
    apart).  Added before the idempotency middleware, so Dramatiq (``after_*`` hooks in
    reverse order) calls it after that one's hooks."""

    def __init__(self) -> None:
        self.acks: defaultdict[str, int] = defaultdict(int)
        self.moved: defaultdict[str, int] = defaultdict(int)
        self.nacks: defaultdict[str, int] = defaultdict(int)

    def after_ack(self, broker: Any, message: Any) -> None:
        delayed = message.queue_name != q_name(message.queue_name)
        (self.moved if delayed else self.acks)[message.message_id] += 1

    def after_nack(self, broker: Any, message: Any) -> None:
        self.nacks[message.message_id] += 1


@dataclass
class Env(UniqueEnv):
    settled: Settled = field(default_factory=Settled)

    def hold_worker(self) -> str:
        blocker = key()
        self.actors["slow"].send(blocker)
        assert self.started[blocker].wait(budget(WAIT))
        return blocker


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    settled = Settled()  # added before the idempotency middleware

    def make(broker: RabbitmqBroker, handler: IdempotencyHandler, prefix: str) -> Env:
        return _declare_actors(Env(broker, handler, prefix, settled=settled))

    with running_env("dramatiq_unique", make, settled) as e:
        yield e


def _declare_actors(e: Env) -> Env:
    def flaky(k: str) -> None:
        e.runs[k] += 1
        if e.runs[k] == 1:
            raise RuntimeError("transient")
        e.started[k].set()
        assert e.gates[k].wait(budget(WAIT))

    def broken(k: str) -> None:
        e.runs[k] += 1
        raise RuntimeError("always")

    # plain actors: the marks need no idempotent=True
    e.actors["slow"] = dramatiq.actor(e.gated, broker=e.broker, actor_name="unique_slow")
    for fn, options in ((flaky, {"min_backoff": 10, "max_backoff": 20}),
                        (broken, {"max_retries": 0})):
        e.actors[fn.__name__] = dramatiq.actor(
            fn, broker=e.broker, actor_name=f"unique_{fn.__name__}", **options
        )
    return e


def test_a_hundred_producers_enqueue_one_message(env: Env) -> None:
    producers, k = 100, key()
    queue = f"held_{uuid.uuid4().hex[:8]}"  # no worker consumes it
    held = dramatiq.actor(lambda k: None, broker=env.broker, actor_name=queue, queue_name=queue)
    messages = at_once(producers, lambda: enqueue_unique(held, k, key=k, tenant=TENANT))
    assert len({message.message_id for message in messages}) == 1
    assert env.broker.get_queue_message_counts(queue)[0] == 1


def test_until_start_a_started_message_no_longer_blocks(env: Env) -> None:
    slow, k = env.actors["slow"], key()
    blocker = env.hold_worker()
    first = enqueue_unique(slow, k, key=k, tenant=TENANT)
    assert enqueue_unique(slow, k, key=k, tenant=TENANT).message_id == first.message_id
    env.gates[blocker].set()
    assert env.started[k].wait(budget(WAIT))
    second = enqueue_unique(slow, k, key=k, tenant=TENANT)
    assert second.message_id != first.message_id
    env.gates[k].set()
    wait_for(lambda: env.runs[k] == 2, "both messages to run")


def test_until_finish_a_running_message_still_blocks(env: Env) -> None:
    slow, k = env.actors["slow"], key()
    first = enqueue_unique(slow, k, key=k, tenant=TENANT, unique_until="finish")
    assert env.started[k].wait(budget(WAIT))
    again = enqueue_unique(slow, k, key=k, tenant=TENANT, unique_until="finish")
    assert again.message_id == first.message_id
    env.gates[k].set()
    wait_for(lambda: env.mark(slow, k) is None, "the mark's release")
    later = enqueue_unique(slow, k, key=k, tenant=TENANT, unique_until="finish")
    assert later.message_id != first.message_id
    wait_for(lambda: env.runs[k] == 2, "the later message to run")


def test_a_retried_message_keeps_the_mark_until_its_final_outcome(env: Env) -> None:
    flaky, k = env.actors["flaky"], key()
    first = enqueue_unique(flaky, k, key=k, tenant=TENANT, unique_until="finish")
    assert env.started[k].wait(budget(WAIT))  # the retry runs
    wait_for(lambda: env.settled.acks[first.message_id] == 1, "the failed attempt's ack")
    wait_for(lambda: env.settled.moved[first.message_id] == 1, "the retry's move from delay")
    assert env.mark(flaky, k) is not None
    assert enqueue_unique(flaky, k, key=k, tenant=TENANT,
                          unique_until="finish").message_id == first.message_id
    env.gates[k].set()
    wait_for(lambda: env.mark(flaky, k) is None, "the mark's release")
    # the mark is released in after_process_message, before the broker's ack: wait for it
    wait_for(lambda: env.settled.acks[first.message_id] == 2, "the retry's ack")
    assert env.runs[k] == 2


def test_a_final_failure_releases_the_mark(env: Env) -> None:
    broken, k = env.actors["broken"], key()
    first = enqueue_unique(broken, k, key=k, tenant=TENANT, unique_until="finish")
    wait_for(lambda: env.settled.nacks[first.message_id] == 1, "the dead letter")
    assert env.mark(broken, k) is None


def test_a_stale_message_does_not_release_the_newer_mark(env: Env) -> None:
    slow, k = env.actors["slow"], key()
    blocker = env.hold_worker()
    stale = enqueue_unique(slow, k, key=k, tenant=TENANT, lease_timeout=0.5)
    record = env.mark(slow, k)
    assert record is not None and record.lease_expires_at is not None
    expiry = record.lease_expires_at
    wait_for(lambda: env.handler.clock() > expiry, "the first mark's lease to expire")
    newer = enqueue_unique(slow, k, key=k, tenant=TENANT)
    assert newer.message_id != stale.message_id
    env.gates[blocker].set()
    assert env.started[k].wait(budget(WAIT))  # the stale message started (and released)
    assert enqueue_unique(slow, k, key=k, tenant=TENANT).message_id == newer.message_id
    env.gates[k].set()
    wait_for(lambda: env.runs[k] == 2, "both messages to run")


def test_a_producer_killed_between_mark_and_publish_blocks_only_for_the_lease(
    env: Env,
) -> None:
    k, queue = key(), f"held_{uuid.uuid4().hex[:8]}"
    held = dramatiq.actor(lambda: None, broker=env.broker, actor_name=queue, queue_name=queue)
    env.broker.declare_queue(queue, ensure=True)
    kill_at_its_mark(
        lambda port: ["tests.dramatiq.unique_producer", env.prefix, str(port), queue, queue, k,
                      "1.0"],
        lambda: env.mark(held, k) is not None,
    )
    record = env.mark(held, k)
    assert record is not None and record.lease_expires_at is not None
    never_published = UniqueMark(TENANT, record.operation, k, record.fencing_token, False)
    pending = enqueue_unique(held, key=k, tenant=TENANT)
    assert pending.message_id == never_published.message_id
    assert env.broker.get_queue_message_counts(queue)[0] == 0
    expiry = record.lease_expires_at
    wait_for(lambda: env.handler.clock() > expiry, "the dead producer's lease")
    published = enqueue_unique(held, key=k, tenant=TENANT)
    assert published.message_id != pending.message_id
    assert env.broker.get_queue_message_counts(queue)[0] == 1


def test_the_options_are_checked(env: Env) -> None:
    with pytest.raises(ConfigurationError):
        enqueue_unique(env.actors["slow"], "x", key="x", tenant=TENANT, unique_until="end")
