"""What the other integrations hand to the decision's span, with the SDK's in-memory
exporter: Dramatiq (a real in-process ``Worker`` on the StubBroker; the queue and the
message id; an async actor's decision runs on Dramatiq's event loop thread and still sees
the worker thread's span and attributes), taskiq (its own receiver on a real Redis stream:
system, queue, task id) and HTTP (the request's span is the parent, and there are no
messaging attributes)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.middleware import AsyncIO, Middleware

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.dramatiq import idempotent_actor
from idempotent_tasks.http import ASGIIdempotencyMiddleware
from idempotent_tasks.taskiq import IdempotencyMiddleware, idempotency_labels, idempotent

from .._services import require
from ..dramatiq.conftest import Env, close_env, make_env
from ..http._apps import ASGIDriver
from ..http.test_asgi import RawApp
from ..taskiq.conftest import _cleanup_redis
from ..taskiq.test_in_process import _broker, _with_receiver
from .conftest import Spans, attributes, link_targets


class SpanPerMessage(Middleware):  # type: ignore[misc]
    """What a Dramatiq instrumentation does: a span current while a message is processed."""

    def __init__(self, spans: Spans) -> None:
        self.spans = spans
        self.open: dict[str, Any] = {}

    def before_process_message(self, broker: Any, message: Any) -> None:
        from opentelemetry import context, trace

        span = self.spans.tracer.start_span(f"process {message.actor_name}")
        self.open[message.message_id] = (span, context.attach(trace.set_span_in_context(span)))

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: Any = None) -> None:
        from opentelemetry import context

        span, token = self.open.pop(message.message_id)
        context.detach(token)
        span.end()

    after_skip_message = after_process_message


@pytest.fixture
def denv(spans: Spans) -> Iterator[Env]:
    e = make_env()
    e.broker.add_middleware(AsyncIO())
    e.broker.add_middleware(SpanPerMessage(spans))
    yield e
    close_env(e)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_otel_dramatiq_spans_carry_the_queue_and_message_id(
    spans: Spans, denv: Env, kind: str
) -> None:
    if kind == "sync":
        @idempotent_actor(actor_name=f"otel_{kind}", queue_name="payments")
        def charge(amount: int) -> int:
            return amount
    else:
        @idempotent_actor(actor_name=f"otel_{kind}", queue_name="payments")
        async def charge(amount: int) -> int:
            return amount

    denv.start()
    first = charge.send_with_options(args=(5,), idempotency_key="k-1", tenant="acme")
    denv.observer.wait_for(lambda ev: len(ev) == 1)
    again = charge.send_with_options(args=(5,), idempotency_key="k-1", tenant="acme")
    denv.join("payments")
    executed, replayed = sorted(spans.decisions(), key=lambda s: s.start_time or 0)
    for span, message, outcome in ((executed, first, "executed"),
                                   (replayed, again, "replayed")):
        got = attributes(span)
        assert got["idempotency.outcome"] == outcome
        assert got["messaging.destination.name"] == "payments"
        assert got["messaging.message.id"] == message.message_id
        assert "messaging.system" not in got  # the StubBroker is no messaging system
        (parent,) = [s for s in spans.named("process ") if span.parent is not None
                     and s.context.span_id == span.parent.span_id]
        assert attributes(parent)["idempotency.outcome"] == outcome
    assert link_targets(replayed) == [executed.context.span_id]


def test_otel_http_the_request_span_is_the_parent(spans: Spans) -> None:
    inner = ASGIIdempotencyMiddleware(RawApp(), IdempotencyHandler(MemoryStore(), metrics=None),
                                      get_tenant=lambda r: "acme", routes=["/echo"])

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        with spans.tracer.start_as_current_span(f"{scope['method']} {scope['path']}"):
            await inner(scope, receive, send)

    driver = ASGIDriver(app)
    assert driver.request("PUT", "/echo", key="k1", content=b"hi").status == 200
    assert driver.request("PUT", "/echo", key="k1", content=b"hi").status == 200
    requests = spans.named("PUT /echo")
    executed, replayed = sorted(spans.decisions(), key=lambda s: s.start_time or 0)
    assert executed.name == "idempotency PUT /echo"
    for span, request in zip((executed, replayed), requests, strict=True):
        assert span.parent is not None and span.parent.span_id == request.context.span_id
        assert not any(k.startswith("messaging.") for k in attributes(span))
        assert attributes(request)["idempotency.key"] == "k1"
    assert link_targets(replayed) == [executed.context.span_id]


def test_otel_taskiq_spans_carry_the_system_queue_and_task_id(spans: Spans) -> None:
    require("redis")
    prefix = f"it_otel_tq_{uuid.uuid4().hex[:10]}"
    kinds: list[str] = []
    broker = _broker(prefix).with_middlewares(IdempotencyMiddleware(
        IdempotencyHandler(MemoryStore(), metrics=None), default_tenant="acme",
        on_outcome=lambda m, o: kinds.append(o.kind)))

    @idempotent(broker, task_name="it.otel_charge")
    async def charge(n: int) -> int:
        return n * 2

    async def scenario() -> list[str]:
        ids = []
        for _ in range(2):
            task = await charge.kicker().with_labels(**idempotency_labels("k-1")).kiq(21)
            assert (await task.wait_result(timeout=30)).return_value == 42
            ids.append(task.task_id)
        return ids

    try:
        ids = asyncio.run(_with_receiver(broker, scenario()))
    finally:
        _cleanup_redis(prefix)
    assert kinds == ["executed", "replayed"]
    executed, replayed = sorted(spans.decisions(), key=lambda s: s.start_time or 0)
    for span, task_id in zip((executed, replayed), ids, strict=True):
        got = attributes(span)
        assert got["messaging.system"] == "redis"
        assert got["messaging.destination.name"] == f"{prefix}:stream"
        assert got["messaging.message.id"] == task_id
    assert link_targets(replayed) == [executed.context.span_id]
