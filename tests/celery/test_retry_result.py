"""A retry that succeeds before its original's RETRY state is stored (real RabbitMQ broker,
real in-process worker, Redis result backend).

Celery's ``Task.retry`` publishes the retry message first; the worker stores the original's
RETRY state afterwards, and its guard against overwriting a SUCCESS reads the state before it
writes.  A retry that runs to SUCCESS on another worker thread (or process) in between is
overwritten: the task id stays RETRY for good although its scope succeeded, and
``AsyncResult.get()`` never returns.  The window is forced here with events: the result
backend holds the RETRY write (after the read, before the write) until the retry's SUCCESS is
stored.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from celery import signals, states
from celery.backends.redis import RedisBackend

from idempotent_tasks import IdempotencyHandler, SQLStore, Status
from idempotent_tasks.celery import IdempotentTask, setup
from tests._claims import claimed, completed
from tests._services import REDIS_URL

from .conftest import RESULT_TIMEOUT, key, new_app, running_worker, wait_for

TENANT = "acme"


class HeldRetryBackend(RedisBackend):  # type: ignore[misc]
    """The Redis result backend, holding one RETRY write open between Celery's read of the
    current state and its write (the backend is per thread: the events are shared)."""

    hold: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Event] = threading.Event()
    release: ClassVar[threading.Event] = threading.Event()
    held_thread: ClassVar[int | None] = None

    def _set_with_state(self, key: str, value: Any, state: str) -> Any:
        cls = HeldRetryBackend
        if state == states.RETRY and cls.hold.is_set():
            cls.hold.clear()
            cls.held_thread = threading.get_ident()
            cls.entered.set()
            assert cls.release.wait(RESULT_TIMEOUT), "the test never released the RETRY write"
        return super()._set_with_state(key, value, state)


@pytest.fixture
def race(tmp_path: Path) -> Iterator[tuple[Any, IdempotencyHandler, threading.Event]]:
    backend = f"{__name__}:{HeldRetryBackend.__name__}+{REDIS_URL}"
    app = new_app("retry_result", result_backend=backend)
    store = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}")
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=None, lease_timeout=30)
    setup(app, handler, beat=False)
    retried = threading.Event()

    @app.task(base=IdempotentTask, shared=False, name="t.retry_result",
              wait_backoff=(0.01, 0.01))
    def task(order: str) -> str:
        return f"ran {order}"

    def on_retry(**_: Any) -> None:  # sent once the worker has handled the retry
        if threading.get_ident() == HeldRetryBackend.held_thread:
            retried.set()

    signals.task_retry.connect(on_retry, weak=False)
    try:
        with running_worker(app, concurrency=2):  # the retry runs while the original waits
            yield task, handler, retried
    finally:
        signals.task_retry.disconnect(on_retry)
        for event in (HeldRetryBackend.hold, HeldRetryBackend.entered):
            event.clear()
        HeldRetryBackend.release.set()
        handler.close()
        store.close()


def test_a_retry_that_succeeded_first_is_not_left_in_retry(
    race: tuple[Any, IdempotencyHandler, threading.Event],
) -> None:
    task, handler, retried = race
    k = key()
    other = handler._engine.prepare(task.name, TENANT, k, {"args": ["o-1"], "kwargs": {}}, True)
    claim = claimed(handler, other)  # another attempt holds the scope: the delivery waits
    HeldRetryBackend.release.clear()
    HeldRetryBackend.hold.set()
    result = task.apply_async(("o-1",), idempotency_key=k, tenant=TENANT)
    # the retry is published; the original's RETRY write is held after Celery read the state
    assert HeldRetryBackend.entered.wait(RESULT_TIMEOUT)
    assert completed(handler, other, claim, "by the other attempt")
    with redis.Redis.from_url(REDIS_URL) as client:
        def state() -> str | None:
            raw = client.get(f"celery-task-meta-{result.id}")
            return None if raw is None else str(json.loads(raw)["status"])

        wait_for(lambda: state() == states.SUCCESS, RESULT_TIMEOUT, "the retry's SUCCESS")
        HeldRetryBackend.release.set()  # now the original stores RETRY over it
        assert retried.wait(RESULT_TIMEOUT), "the original never finished its retry"
        assert state() == states.SUCCESS
    assert result.get(timeout=RESULT_TIMEOUT) == "by the other attempt"
    record = handler.get_record(operation=task.name, tenant=TENANT, key=k)
    assert record is not None and record.status is Status.SUCCESS
