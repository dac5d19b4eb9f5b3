"""The per-operation policies as ``@idempotent_actor(...)`` options, against StubBroker and a
real in-process Worker: registered as the actor's operation defaults, ``on_success="reject"``
dead-letters a duplicate of a success (Dramatiq's own ``Callbacks`` middleware, which reads
the plain ``on_success`` / ``on_failure`` options, is left alone), and with
``on_in_progress="wait"`` a duplicate delivered while the first runs waits (observed through
the handler's ``duplicate_waiting`` event) and ends with the first's result."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, ErrorCode, create_logger_adapter
from idempotent_tasks.dramatiq import get_context, idempotent_actor
from tests._every_store import Events
from tests._wait import budget

from .conftest import Env, close_env, make_env

FAST: dict[str, Any] = {"min_backoff": 10, "max_backoff": 40}


def test_on_success_reject_dead_letters_a_duplicate_of_a_success(env: Env) -> None:
    runs: list[int] = []

    @idempotent_actor(on_success="reject", reuse_after=3600, on_failure="allow_new_attempt",
                      store_results=True, **FAST)
    def once(n: int) -> int:
        runs.append(n)
        return n

    o = env.handler.options_for("once")
    assert (o.on_success, o.reuse_after, o.on_failure) == ("reject", 3600, "allow_new_attempt")
    assert once.options["idempotency_on_success"] == "reject"
    assert "on_success" not in once.options and "on_failure" not in once.options
    env.start()
    first = once.send_with_options(args=(1,), idempotency_key="k-1", tenant="acme")
    env.join()
    second = once.send_with_options(args=(1,), idempotency_key="k-1", tenant="acme")
    env.join()
    assert runs == [1]
    assert first.get_result(backend=env.backend) == 1
    assert env.dead_letter_ids() == [second.message_id]
    ctx = get_context(env.broker.dead_letters[0])
    assert ctx is not None and ctx.outcome == "rejected"
    assert env.observer.errors(ErrorCode.DUPLICATE_REJECTED.value)


def test_the_plain_callbacks_options_are_refused_as_idempotency_names() -> None:
    with pytest.raises(ConfigurationError, match="on_success="):
        idempotent_actor(idempotency_on_success="reject")


def test_a_waiting_duplicate_ends_with_the_first_result() -> None:
    events = Events()
    env = make_env(handler_kwargs={"logger": create_logger_adapter(events)})
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []
    try:

        @idempotent_actor(on_in_progress="wait", wait_timeout=budget(20), store_results=True,
                          **FAST)
        def slow(n: int) -> int:
            runs.append(n)
            started.set()
            assert release.wait(budget(10))
            return n * 10

        env.start(threads=2)
        first = slow.send_with_options(args=(7,), idempotency_key="same", tenant="acme")
        assert started.wait(budget(10))
        dup = slow.send_with_options(args=(7,), idempotency_key="same", tenant="acme")
        try:
            events.wait_for("duplicate_waiting")
        finally:
            release.set()
        env.join()
        assert runs == [7]
        assert dup.get_result(backend=env.backend) == 70 == first.get_result(backend=env.backend)
        assert env.observer.errors() == []  # the duplicate was never retried
        assert env.dead_letter_ids() == []
    finally:
        close_env(env)
