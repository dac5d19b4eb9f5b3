"""Every Outcome kind, traced: the child span ``idempotency <operation>`` under the span that
was current, its attributes (and the same ``idempotency.*`` on that parent), ERROR status
for poisoned and failed, and the link from a replay to the execution it replays.  The SDK's
in-memory exporter; the memory store with a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from idempotent_tasks import IdempotencyHandler, MemoryStore, Outcome
from idempotent_tasks._core import tracing
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

from .conftest import Spans, attributes, link_targets

OP = "orders.charge"
TENANT = "acme"


class Declined(Exception):
    """A permanent business error."""


def handler(store: Any = None, clock: FakeClock | None = None) -> IdempotencyHandler:
    return IdempotencyHandler(store or MemoryStore(), metrics=None, clock=clock or FakeClock(),
                              lease_timeout=30, max_retries=3, outcome_retry_timeout=0.05)


def run(h: IdempotencyHandler, fn: Any, key: str | None = "k-1", **kw: Any) -> Outcome:
    return h.run(fn, operation=OP, tenant=TENANT, key=key, permanent=(Declined,), **kw)


def under_parent(spans: Spans, h: IdempotencyHandler, fn: Any, **kw: Any) -> Outcome:
    with spans.tracer.start_as_current_span("app"):
        return run(h, fn, **kw)


def check_decision(spans: Spans, outcome: Outcome, kind: str) -> dict[str, Any]:
    """The decision's span is the app span's child and carries the outcome; the app span
    got the same ``idempotency.*`` attributes."""
    assert outcome.kind == kind
    child, parent = spans.one(), spans.one("app")
    assert child.name == f"idempotency {OP}"
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    got = attributes(child)
    assert got["idempotency.outcome"] == kind
    assert got["idempotency.operation"] == OP
    assert got["idempotency.retry_count"] == outcome.retry_count
    if outcome.key is not None:
        assert got["idempotency.key"] == outcome.key
        assert got["idempotency.tenant"] == TENANT
    if outcome.fencing_token is not None:
        assert got["idempotency.fencing_token"] == outcome.fencing_token
    if outcome.error_code is not None:
        assert got["idempotency.error_code"] == outcome.error_code.value
    assert {k: v for k, v in attributes(parent).items() if k.startswith("idempotency.")} == got
    error = kind in ("poisoned", "failed")
    assert child.status.status_code is (StatusCode.ERROR if error else StatusCode.UNSET)
    return got


def test_otel_executed_then_replayed_links_to_the_execution(spans: Spans) -> None:
    h = handler()
    first = under_parent(spans, h, lambda: {"ok": 1})
    got = check_decision(spans, first, "executed")
    assert got["idempotency.fencing_token"] == first.fencing_token
    executed = spans.one()
    spans.clear()
    again = under_parent(spans, h, lambda: {"ok": 2})
    check_decision(spans, again, "replayed")
    assert again.result == {"ok": 1}
    assert link_targets(spans.one()) == [executed.context.span_id]
    ctx = executed.context
    assert again.replayed_from == (
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    )


def test_otel_the_bodys_spans_nest_under_the_decision(spans: Spans) -> None:
    def body() -> str:
        with spans.tracer.start_as_current_span("charge the card"):
            return "done"

    under_parent(spans, handler(), body)
    inner, decision = spans.one("charge the card"), spans.one()
    assert inner.parent is not None and inner.parent.span_id == decision.context.span_id


def test_otel_in_progress(spans: Spans) -> None:
    h = handler()
    seen: list[Outcome] = []

    def body() -> str:  # a second delivery while the first one runs
        seen.append(run(h, lambda: "never"))
        return "first"

    under_parent(spans, h, body)
    (inner,) = seen
    assert inner.kind == "in_progress"
    decisions = {attributes(s)["idempotency.outcome"]: s for s in spans.decisions()}
    nested = decisions["in_progress"]
    assert nested.parent is not None
    assert nested.parent.span_id == decisions["executed"].context.span_id
    assert attributes(nested)["idempotency.error_code"] == "REQUEST_IN_PROGRESS"
    assert nested.status.status_code is StatusCode.UNSET
    outer = attributes(decisions["executed"])  # the nested run left its parent alone
    assert "idempotency.error_code" not in outer
    assert {k: v for k, v in attributes(spans.one("app")).items()
            if k.startswith("idempotency.")} == outer


def test_otel_failed_is_an_error_with_the_exception(spans: Spans) -> None:
    def body() -> None:
        raise TimeoutError("gateway timed out")

    outcome = under_parent(spans, handler(), body)
    check_decision(spans, outcome, "failed")
    span = spans.one()
    assert span.status.description == "TimeoutError: gateway timed out"
    (event,) = [e for e in span.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "TimeoutError"


def test_otel_poisoned_is_an_error(spans: Spans) -> None:
    def body() -> None:
        raise Declined("card declined")

    h = handler()
    outcome = under_parent(spans, h, body)
    check_decision(spans, outcome, "poisoned")
    spans.clear()
    again = under_parent(spans, h, lambda: "never")  # the poisoned scope refuses
    got = check_decision(spans, again, "poisoned")
    assert got["idempotency.error_code"] == "REQUEST_FAILED"
    assert spans.one().status.description == "this scope is poisoned (FAILED)"


def test_otel_rejected_before_any_io(spans: Spans) -> None:
    outcome = under_parent(spans, handler(), lambda: "never", key="bad\x00key")
    got = check_decision(spans, outcome, "rejected")
    assert got["idempotency.error_code"] == "INVALID_KEY"


def test_otel_store_unavailable(spans: Spans) -> None:
    store = FaultyStore(MemoryStore())
    store.fail("create")
    outcome = under_parent(spans, handler(store), lambda: "never")
    got = check_decision(spans, outcome, "store_unavailable")
    assert got["idempotency.error_code"] == "STORE_UNAVAILABLE"


def test_otel_a_takeover_counts_the_crashed_attempt(spans: Spans) -> None:
    clock = FakeClock()
    h = handler(clock=clock)
    crashed = simulate_crash(h, operation=OP, tenant=TENANT, key="k-1")
    assert isinstance(crashed, int)
    spans.clear()  # the simulation's own span (it records Abandon)
    clock.advance(31)
    outcome = under_parent(spans, h, lambda: "second try")
    got = check_decision(spans, outcome, "executed")
    assert got["idempotency.retry_count"] == 1
    assert got["idempotency.fencing_token"] > crashed


def test_otel_messaging_attributes_go_on_the_decision_span_only(spans: Spans) -> None:
    h = handler()
    with tracing.messaging_attributes(
        {"messaging.rabbitmq.destination.routing_key": "orders"},
        messaging_system="rabbitmq", messaging_message_id="m-1", messaging_destination_name=None,
    ):
        under_parent(spans, h, lambda: "ok")
    got = attributes(spans.one())
    assert got["messaging.system"] == "rabbitmq"
    assert got["messaging.message.id"] == "m-1"
    assert got["messaging.rabbitmq.destination.routing_key"] == "orders"
    assert "messaging.destination.name" not in got
    assert not any(k.startswith("messaging.") for k in attributes(spans.one("app")))


def test_otel_run_async_and_execute_are_traced_the_same_way(spans: Spans) -> None:
    h = handler()

    async def body() -> str:
        return "async"

    async def both() -> Outcome:
        with spans.tracer.start_as_current_span("app"):
            return await h.run_async(body, operation=OP, tenant=TENANT, key="k-async")

    assert asyncio.run(both()).kind == "executed"
    executed = spans.one()
    assert executed.parent is not None
    assert executed.parent.span_id == spans.one("app").context.span_id
    spans.clear()
    assert h.execute(lambda: "sync", operation=OP, tenant=TENANT, key="k-async") == "async"
    assert link_targets(spans.one()) == [executed.context.span_id]


@pytest.mark.parametrize("batch_completion", [False, True])
def test_otel_run_many_traces_each_call_with_its_own_attributes(
    spans: Spans, batch_completion: bool
) -> None:
    h = handler()
    run(h, lambda: "before")  # k-1 succeeded earlier: replayed in the batch
    executed_before = spans.one()
    spans.clear()
    calls = [
        {"operation": OP, "tenant": TENANT, "key": key,
         tracing.ATTRIBUTES_ENTRY: {"messaging.message.id": f"m-{key}"}}
        for key in ("k-1", "k-2", "bad\x00key", "k-3")
    ]

    def body(call: dict[str, Any]) -> str:
        with spans.tracer.start_as_current_span(f"body {call['key']}"):
            return f"ran {call['key']}"

    with spans.tracer.start_as_current_span("batch"):
        outcomes = h.run_many(calls, body, batch_completion=batch_completion)
    assert [o.kind for o in outcomes] == ["replayed", "executed", "rejected", "executed"]
    by_id = {attributes(s)["messaging.message.id"]: s for s in spans.decisions()}
    assert len(by_id) == 4 == len(spans.decisions())
    batch = spans.one("batch")
    for key, outcome in zip(("k-1", "k-2", "bad\x00key", "k-3"), outcomes, strict=True):
        span = by_id[f"m-{key}"]
        assert attributes(span)["idempotency.outcome"] == outcome.kind
        assert span.parent is not None and span.parent.span_id == batch.context.span_id
    assert link_targets(by_id["m-k-1"]) == [executed_before.context.span_id]
    for key in ("k-2", "k-3"):  # each body nests under its own call's span
        inner = spans.one(f"body {key}")
        assert inner.parent is not None
        assert inner.parent.span_id == by_id[f"m-{key}"].context.span_id
    spans.clear()
    replays = h.run_many(calls[1:2] + calls[3:], body)  # each replay links to its own call
    assert [o.kind for o in replays] == ["replayed", "replayed"]
    again = {attributes(s)["messaging.message.id"]: s for s in spans.decisions()}
    for key in ("k-2", "k-3"):
        assert link_targets(again[f"m-{key}"]) == [by_id[f"m-{key}"].context.span_id]


def test_otel_a_base_exception_out_of_the_body_is_recorded_as_it_propagates(
    spans: Spans,
) -> None:
    def body() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        under_parent(spans, handler(), body)
    span = spans.one()
    (event,) = [e for e in span.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "KeyboardInterrupt"
