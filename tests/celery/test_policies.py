"""The per-operation policies as Celery task options: ``@idempotent_task(...)`` keywords and
``IdempotentTask`` class attributes reach the engine (registered as the operation's defaults
and passed on every delivery), ``on_success`` / ``on_failure`` never shadow Celery's handler
methods of those names, and — on RabbitMQ with a real worker — a duplicate delivery of an
``on_in_progress="wait"`` task waits for the running one and ends with its result."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from idempotent_tasks import (
    ConfigurationError,
    IdempotencyHandler,
    MemoryStore,
    SQLStore,
    create_logger_adapter,
)
from idempotent_tasks.celery import IdempotentTask, idempotent_task, setup
from tests._every_store import Events
from tests._wait import budget

from .conftest import RESULT_TIMEOUT, Counter, key, new_app, running_worker


def eager_app() -> tuple[Celery, IdempotencyHandler]:
    app = Celery("policies", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    setup(app, handler)
    return app, handler


def test_on_success_reject_fails_the_second_delivery_without_running_it() -> None:
    app, handler = eager_app()
    runs = Counter()

    @idempotent_task(name="p.once", on_success="reject", wait_timeout=3, reuse_after=60,
                     on_in_progress="wait", on_failure="allow_new_attempt")
    def once() -> str:
        runs.hit("once")
        return "done"

    task = app.tasks["p.once"]
    o = handler.options_for("p.once")
    assert (o.on_success, o.wait_timeout, o.reuse_after, o.on_in_progress, o.on_failure) == (
        "reject", 3, 60, "wait", "allow_new_attempt")
    k = key()
    assert task.apply_async(idempotency_key=k, tenant="t").get() == "done"
    with pytest.raises(Exception) as info:
        task.apply_async(idempotency_key=k, tenant="t").get()
    assert info.value.code == "DUPLICATE_REJECTED"
    assert runs["once"] == 1


def test_class_attributes_set_the_policies_and_keep_celerys_handlers() -> None:
    """``on_success = "reject"`` on an ``IdempotentTask`` subclass is the policy (moved to
    ``idempotency_on_success``); Celery's ``on_success`` handler method stays callable, and a
    handler given to the decorator is still Celery's."""
    app, handler = eager_app()
    notified: list[Any] = []

    class Strict(IdempotentTask):
        on_success = "reject"
        on_failure = "allow_new_attempt"

    assert Strict.idempotency_on_success == "reject"
    assert Strict.idempotency_on_failure == "allow_new_attempt"
    assert callable(Strict.on_success) and callable(Strict.on_failure)

    @app.task(base=Strict, shared=False, name="p.strict")
    def strict() -> int:
        return 1

    def hook(self: Any, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        notified.append(retval)

    @idempotent_task(name="p.hooked", on_success=hook)  # type: ignore[arg-type]
    def hooked() -> int:
        return 2

    app.finalize()  # binds the tasks: their options are registered
    assert handler.options_for("p.strict").on_success == "reject"
    assert handler.options_for("p.hooked").on_success == "replay"
    k = key()
    assert strict.apply_async(idempotency_key=k, tenant="t").get() == 1
    with pytest.raises(Exception) as info:
        strict.apply_async(idempotency_key=k, tenant="t").get()
    assert info.value.code == "DUPLICATE_REJECTED"
    assert app.tasks["p.hooked"].apply_async(idempotency_key=key(), tenant="t").get() == 2
    assert notified == [2]


def test_a_bad_policy_fails_when_the_task_is_bound() -> None:
    app, _ = eager_app()
    with pytest.raises(ConfigurationError, match="on_in_progress"):

        @app.task(base=IdempotentTask, shared=False, name="p.bad", on_in_progress="later")
        def bad() -> None:
            return None

        app.finalize()  # binding the task registers its options


def test_a_waiting_duplicate_on_a_real_worker_ends_with_the_first_result(
    tmp_path: Path,
) -> None:
    """Two deliveries of one scope on RabbitMQ, a worker with 4 threads: the first is held in
    its body by an event; the duplicate, published meanwhile, waits (the handler logs
    ``duplicate_waiting``) instead of retrying, and once the first returns its own
    ``AsyncResult`` is the first's result.  The body ran once."""
    store = SQLStore(f"sqlite:///{tmp_path / 'idem.db'}")
    store.create_schema()
    events = Events()
    handler = IdempotencyHandler(store, metrics=None, logger=create_logger_adapter(events))
    app = new_app("policies")
    setup(app, handler)
    runs, entered, release = Counter(), threading.Event(), threading.Event()

    @idempotent_task(name="p.waited", on_in_progress="wait", wait_timeout=budget(RESULT_TIMEOUT))
    def waited(order: str) -> dict[str, Any]:
        n = runs.hit(order)
        entered.set()
        assert release.wait(budget(RESULT_TIMEOUT))
        return {"order": order, "run": n}

    task = app.tasks["p.waited"]
    try:
        with running_worker(app, concurrency=4):
            k = key()
            first = task.apply_async(("o-1",), idempotency_key=k, tenant="acme")
            assert entered.wait(budget(RESULT_TIMEOUT))  # the first is inside its body
            duplicate = task.apply_async(("o-1",), idempotency_key=k, tenant="acme")
            try:
                events.wait_for("duplicate_waiting")
                assert not duplicate.ready()  # it waits, it was not retried or failed
            finally:
                release.set()
            expected = {"order": "o-1", "run": 1}
            assert first.get(timeout=budget(RESULT_TIMEOUT)) == expected
            assert duplicate.get(timeout=budget(RESULT_TIMEOUT)) == expected
            assert duplicate.id != first.id
            assert runs["o-1"] == 1
    finally:
        handler.close()
        store.close()
