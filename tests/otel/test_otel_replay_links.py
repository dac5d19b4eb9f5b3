"""A replay's span links to the span of the execution it replays, whatever keeps the record:
each store keeps the execution's traceparent beside the response (``tracing.wrap``), and
every read of a response hands the user the response alone (``get_record``, the replay).

Stores: memory, SQLite, PostgreSQL, Redis, MariaDB, DynamoDB (moto_server), and the async
PostgreSQL and Redis stores through ``run_async`` on their own loop; a transactional body's
SUCCESS (SQLite, PostgreSQL) and a replay served by the cache too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryCache, MemoryStore
from idempotent_tasks._core import tracing
from idempotent_tasks._core.records import Scope, Status

from .._async_stores import ASYNC_STORE_KINDS, LoopThread, loop_of
from ..conftest import STORE_KINDS, drop_store, make_store, store_of_kind
from .conftest import Spans, attributes, link_targets

OP, TENANT = "orders.charge", "acme"


@pytest.fixture(params=STORE_KINDS + ASYNC_STORE_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def store(kind: str, tmp_path: Path) -> Iterator[Any]:
    with store_of_kind(kind, tmp_path, "ot") as made:
        if kind in ASYNC_STORE_KINDS:
            made._test_loop = loop_of(made)
        yield made


def deliver(spans: Spans, h: IdempotencyHandler, store: Any, key: str, value: Any) -> Any:
    """One delivery under an ``app`` span, sync or on the async store's loop."""
    loop: LoopThread | None = getattr(store, "_test_loop", None)
    if loop is None:
        with spans.tracer.start_as_current_span("app"):
            return h.run(lambda: value, operation=OP, tenant=TENANT, key=key)

    async def body() -> Any:
        return value

    async def on_loop() -> Any:
        with spans.tracer.start_as_current_span("app"):
            return await h.run_async(body, operation=OP, tenant=TENANT, key=key)

    return loop.run(on_loop())


def stored_response(store: Any, key: str) -> bytes:
    loop: LoopThread | None = getattr(store, "_test_loop", None)
    scope = Scope(TENANT, OP, key)
    record = store.get(scope) if loop is None else loop.run(store.get(scope))
    assert record is not None and record.status is Status.SUCCESS
    return bytes(record.response)


def test_otel_a_replay_links_to_the_execution_on_every_store(spans: Spans, store: Any) -> None:
    h = IdempotencyHandler(store, metrics=None)
    first = deliver(spans, h, store, "k-1", {"charged": 10})
    assert first.kind == "executed"
    executed = spans.one()
    encoded, parent = tracing.unwrap(stored_response(store, "k-1"))
    assert encoded == b'{"charged":10}'
    ctx = executed.context
    assert parent == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    spans.clear()
    again = deliver(spans, h, store, "k-1", {"charged": 99})
    assert (again.kind, again.result) == ("replayed", {"charged": 10})
    replay = spans.one()
    assert link_targets(replay) == [ctx.span_id]
    assert attributes(replay)["idempotency.outcome"] == "replayed"
    if getattr(store, "_test_loop", None) is None:
        record = h.get_record(operation=OP, tenant=TENANT, key="k-1")
        assert record is not None and record.response == {"charged": 10}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_otel_a_transactional_success_keeps_its_traceparent(
    spans: Spans, kind: str, tmp_path: Path
) -> None:
    store = make_store(kind, tmp_path)
    try:
        h = IdempotencyHandler(store, metrics=None)
        with spans.tracer.start_as_current_span("app"):
            assert h.execute_in_transaction(
                lambda conn: "in tx", operation=OP, tenant=TENANT, key="k-tx"
            ) == "in tx"
        executed = spans.one()
        assert tracing.unwrap(stored_response(store, "k-tx"))[1] is not None
        spans.clear()
        with spans.tracer.start_as_current_span("app"):
            again = h.run(lambda conn: "never", operation=OP, tenant=TENANT, key="k-tx",
                          transactional=True)
        assert (again.kind, again.result) == ("replayed", "in tx")
        assert link_targets(spans.one()) == [executed.context.span_id]
    finally:
        drop_store(store)


def test_otel_a_replay_from_the_cache_links_to_the_execution(spans: Spans) -> None:
    h = IdempotencyHandler(MemoryStore(), MemoryCache(), metrics=None)
    h.run(lambda: "cached", operation=OP, tenant=TENANT, key="k-c")
    executed = spans.one()
    spans.clear()
    again = h.run(lambda: "never", operation=OP, tenant=TENANT, key="k-c")
    assert (again.kind, again.result, again.fencing_token) == ("replayed", "cached", None)
    assert link_targets(spans.one()) == [executed.context.span_id]
