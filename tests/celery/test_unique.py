"""Unique enqueue for Celery, on a real RabbitMQ broker with a real (in-process) worker and the
Redis store.

What the broker holds is counted with publisher confirms on (a confirmed message is in its
queue), on queues the worker does not consume.  Windows are forced with events: a blocker
task holds the single worker thread, so a message stays pending (not started) until the test
lets the blocker go, and each body waits on its own gate.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from idempotent_tasks import ConfigurationError, IdempotencyHandler
from idempotent_tasks.celery import enqueue_unique, setup
from idempotent_tasks.enqueue import UniqueMark
from tests._race import at_once
from tests._silent_broker import kill_at_its_mark

from ._unique_env import TENANT, UniqueEnv, running_env
from .conftest import RESULT_TIMEOUT, key, wait_for


@dataclass
class Env(UniqueEnv):
    retried: defaultdict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event))

    def hold_worker(self) -> str:
        """Occupy the worker's one thread until the returned gate opens."""
        blocker = key()
        self.tasks["slow"].apply_async((blocker,))
        assert self.started[blocker].wait(RESULT_TIMEOUT)
        return blocker

    def on_postrun(
        self, task: Any = None, state: str | None = None, args: Any = (), **_: Any
    ) -> None:
        # connected after setup's receiver: once this runs, the mark saw this state too
        if (getattr(task, "name", None), state) in (
            ("t.unique_retrying", "RETRY"), ("t.unique_requeued", "REJECTED")
        ):
            self.retried[args[0]].set()


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with running_env("unique", _declare) as e:
        signals.task_postrun.connect(e.on_postrun, weak=False)
        try:
            yield e
        finally:
            signals.task_postrun.disconnect(e.on_postrun)


def _declare(app: Celery, handler: IdempotencyHandler, prefix: str) -> Env:
    e = Env(app, handler, prefix)

    @app.task(name="t.unique_slow", shared=False)  # a plain task: the marks need no base
    def slow(k: str) -> str:
        e.runs.hit(k)
        e.started[k].set()
        assert e.gates[k].wait(RESULT_TIMEOUT)
        return k

    @app.task(name="t.unique_retrying", bind=True, shared=False)
    def retrying(self: Any, k: str) -> str:
        e.runs.hit(k)
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        e.started[k].set()
        assert e.gates[k].wait(RESULT_TIMEOUT)
        return k

    @app.task(name="t.unique_requeued", bind=True, shared=False, acks_late=True)
    def requeued(self: Any, k: str) -> str:
        e.runs.hit(k)
        if e.runs[k] == 1:
            raise Reject("not now", requeue=True)
        e.started[k].set()
        assert e.gates[k].wait(RESULT_TIMEOUT)
        return k

    e.tasks.update(slow=slow, retrying=retrying, requeued=requeued)
    return e


def test_a_hundred_producers_publish_one_message(env: Env) -> None:
    k, queue = key(), f"held_{uuid.uuid4().hex[:8]}"
    results = at_once(100, lambda: enqueue_unique(
        env.tasks["slow"], (k,), key=k, tenant=TENANT, queue=queue))
    try:
        assert len({result.id for result in results}) == 1
        assert env.queued(queue) == 1
    finally:
        env.drop(queue)


def test_until_start_a_started_task_no_longer_blocks(env: Env) -> None:
    slow, k = env.tasks["slow"], key()
    blocker = env.hold_worker()
    first = enqueue_unique(slow, (k,), key=k, tenant=TENANT)
    assert enqueue_unique(slow, (k,), key=k, tenant=TENANT).id == first.id  # pending
    env.gates[blocker].set()
    assert env.started[k].wait(RESULT_TIMEOUT)  # running: released when it started
    second = enqueue_unique(slow, (k,), key=k, tenant=TENANT)
    assert second.id != first.id
    env.gates[k].set()
    assert first.get(timeout=RESULT_TIMEOUT) == k
    assert second.get(timeout=RESULT_TIMEOUT) == k
    assert env.runs[k] == 2


def test_until_finish_a_running_task_still_blocks(env: Env) -> None:
    slow, k = env.tasks["slow"], key()
    first = enqueue_unique(slow, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert env.started[k].wait(RESULT_TIMEOUT)
    again = enqueue_unique(slow, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert again.id == first.id
    env.gates[k].set()
    assert first.get(timeout=RESULT_TIMEOUT) == k
    wait_for(lambda: env.mark(slow, k) is None, RESULT_TIMEOUT, "the mark's release")
    later = enqueue_unique(slow, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert later.id != first.id
    assert later.get(timeout=RESULT_TIMEOUT) == k
    assert env.runs[k] == 2


def test_a_retry_is_not_blocked_and_keeps_the_mark_until_the_final_outcome(env: Env) -> None:
    retrying, k = env.tasks["retrying"], key()
    first = enqueue_unique(retrying, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert env.started[k].wait(RESULT_TIMEOUT)  # the retry runs (the first attempt retried)
    assert env.retried[k].wait(RESULT_TIMEOUT)  # and the first attempt ended in RETRY
    assert env.runs[k] == 2
    assert env.mark(retrying, k) is not None
    again = enqueue_unique(retrying, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert again.id == first.id
    env.gates[k].set()
    assert first.get(timeout=RESULT_TIMEOUT) == k
    wait_for(lambda: env.mark(retrying, k) is None, RESULT_TIMEOUT, "the mark's release")
    assert env.runs[k] == 2


def test_a_requeued_rejection_keeps_the_mark(env: Env) -> None:
    requeued, k = env.tasks["requeued"], key()
    first = enqueue_unique(requeued, (k,), key=k, tenant=TENANT, unique_until="finish")
    assert env.retried[k].wait(RESULT_TIMEOUT)  # rejected with requeue: it comes back
    assert env.started[k].wait(RESULT_TIMEOUT)
    assert env.mark(requeued, k) is not None
    env.gates[k].set()
    assert first.get(timeout=RESULT_TIMEOUT) == k
    wait_for(lambda: env.mark(requeued, k) is None, RESULT_TIMEOUT, "the mark's release")


def test_a_stale_message_does_not_release_the_newer_mark(env: Env) -> None:
    """The first message's lease expires while it is pending; a new producer takes the mark
    over.  When the stale message starts, its release (old token) leaves the newer mark."""
    slow, k = env.tasks["slow"], key()
    blocker = env.hold_worker()
    stale = enqueue_unique(slow, (k,), key=k, tenant=TENANT, lease_timeout=0.5)
    record = env.mark(slow, k)
    assert record is not None and record.lease_expires_at is not None
    expiry = record.lease_expires_at
    wait_for(lambda: env.handler.clock() > expiry, 5, "the first mark's lease to expire")
    newer = enqueue_unique(slow, (k,), key=k, tenant=TENANT)
    assert newer.id != stale.id
    env.gates[blocker].set()
    assert env.started[k].wait(RESULT_TIMEOUT)  # the stale message started (and released)
    assert enqueue_unique(slow, (k,), key=k, tenant=TENANT).id == newer.id
    env.gates[k].set()
    assert stale.get(timeout=RESULT_TIMEOUT) == k
    assert newer.get(timeout=RESULT_TIMEOUT) == k


def test_a_producer_killed_between_mark_and_publish_blocks_only_for_the_lease(
    env: Env,
) -> None:
    slow, k, queue = env.tasks["slow"], key(), f"held_{uuid.uuid4().hex[:8]}"
    kill_at_its_mark(
        lambda port: ["tests.celery.unique_producer", env.prefix, str(port), slow.name, k, "1.0"],
        lambda: env.mark(slow, k) is not None,
    )
    record = env.mark(slow, k)
    assert record is not None and record.lease_expires_at is not None
    never_published = UniqueMark(TENANT, record.operation, k, record.fencing_token, False)
    try:
        pending = enqueue_unique(slow, (k,), key=k, tenant=TENANT, queue=queue)
        assert pending.id == never_published.message_id
        assert env.queued(queue) == 0
        expiry = record.lease_expires_at
        wait_for(lambda: env.handler.clock() > expiry, 5, "the dead producer's lease")
        published = enqueue_unique(slow, (k,), key=k, tenant=TENANT, queue=queue)
        assert published.id != pending.id
        assert env.queued(queue) == 1
    finally:
        env.drop(queue)


def test_the_options_are_checked(env: Env) -> None:
    with pytest.raises(ConfigurationError):
        enqueue_unique(env.tasks["slow"], ("x",), key="x", tenant=TENANT, unique_until="end")
    with pytest.raises(ConfigurationError):
        enqueue_unique(env.tasks["slow"], ("x",), key="x", tenant=TENANT, task_id="mine")


def test_a_publish_that_raises_hands_the_mark_back(env: Env) -> None:
    """The broker refuses the connection: the error reaches the caller and the scope is not
    blocked until the lease ends."""
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    down = Celery("down", broker=f"amqp://guest:guest@127.0.0.1:{port}//", set_as_current=False)
    down.conf.update(task_publish_retry=False, broker_connection_timeout=5,
                     broker_connection_retry=False, broker_connection_max_retries=0)
    setup(down, env.handler, beat=False)

    @down.task(name=env.tasks["slow"].name, shared=False)  # type: ignore[untyped-decorator]
    def slow(k: str) -> None: ...

    k = key()
    with pytest.raises(OperationalError):
        enqueue_unique(slow, (k,), key=k, tenant=TENANT)
    assert env.mark(slow, k) is None
