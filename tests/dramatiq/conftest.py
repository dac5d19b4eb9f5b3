"""Fixtures for the Dramatiq integration: a StubBroker with the middleware, an in-process
Worker, and an observer that lets tests wait for *events* (a retry, a skip) instead of
sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware
from idempotent_tasks.testing import FaultyStore
from tests._wait import budget


@dataclass
class Event:
    message_id: str
    actor_name: str
    kind: str  # "done" | "error" | "skipped"
    exception: BaseException | None = None
    result: Any = None


@dataclass
class Observer(Middleware):
    """Records every processed message and wakes waiters (a Condition, not sleeps)."""

    events: list[Event] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def _add(self, event: Event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def after_process_message(self, broker, message, *, result=None, exception=None):  # type: ignore[no-untyped-def]
        kind = "done" if exception is None else "error"
        self._add(Event(message.message_id, message.actor_name, kind, exception, result))

    def after_skip_message(self, broker, message):  # type: ignore[no-untyped-def]
        self._add(Event(message.message_id, message.actor_name, "skipped"))

    def wait_for(self, predicate: Callable[[list[Event]], bool], timeout: float = 10.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self.events), budget(timeout)):
                raise AssertionError(f"timed out; events: {self.events}")

    def errors(self, code: str | None = None) -> list[Event]:
        return [
            e for e in self.events
            if e.kind == "error" and (code is None or getattr(e.exception, "code", None) == code)
        ]


@dataclass
class Env:
    broker: StubBroker
    handler: IdempotencyHandler
    store: FaultyStore
    middleware: IdempotencyMiddleware
    observer: Observer
    backend: StubBackend
    worker: dramatiq.Worker | None = None

    def start(self, threads: int = 4) -> dramatiq.Worker:
        self.worker = dramatiq.Worker(self.broker, worker_timeout=20, worker_threads=threads)
        self.worker.start()
        return self.worker

    def join(self, queue: str = "default") -> None:
        self.broker.join(queue, fail_fast=False, timeout=20_000)
        assert self.worker is not None
        self.worker.join()

    def redeliver(self, message: dramatiq.Message[Any]) -> None:
        """A broker redelivery: the very same message (same id) enqueued again."""
        self.broker.enqueue(message)

    def dead_letter_ids(self) -> list[str]:
        return [m.message_id for m in self.broker.dead_letters]


def make_env(
    store: Any = None, *, handler_kwargs: dict[str, Any] | None = None,
    default_tenant: str | None = None, maintenance: bool = False, **mw: Any,
) -> Env:
    faulty = FaultyStore(store if store is not None else MemoryStore())
    handler = IdempotencyHandler(faulty, metrics=None, **(handler_kwargs or {}))
    broker = StubBroker()
    broker.emit_after("process_boot")
    middleware = IdempotencyMiddleware(
        handler, default_tenant=default_tenant, maintenance=maintenance, **mw
    )
    broker.add_middleware(middleware)
    backend = StubBackend()
    broker.add_middleware(Results(backend=backend))  # type: ignore[no-untyped-call]
    observer = Observer()
    broker.add_middleware(observer)
    dramatiq.set_broker(broker)
    return Env(broker, handler, faulty, middleware, observer, backend)


@pytest.fixture
def env() -> Iterator[Env]:
    e = make_env()
    yield e
    close_env(e)


def close_env(e: Env) -> None:
    if e.worker is not None:
        e.worker.stop()
    e.broker.close()
    e.handler.close()
