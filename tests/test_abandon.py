"""``Abandon``: a body that walks away as a killed worker does — nothing written, the claim
PROCESSING with its token and its lease until the lease expires, the attempt counted by
whoever takes the scope over.  ``testing.simulate_crash`` is built on it."""

from __future__ import annotations

import asyncio

import pytest

from idempotent_tasks import Abandon, IdempotencyHandler, MemoryStore, Status, current_context
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, simulate_crash

SCOPE = {"operation": "orders.charge", "tenant": "acme", "key": "k-1"}
LEASE = 30.0


def _walk_away(tokens: list[int]) -> None:
    ctx = current_context()
    assert ctx is not None and ctx.fencing_token is not None
    tokens.append(ctx.fencing_token)
    raise Abandon()


def test_abandon_writes_nothing_and_the_takeover_counts_it(store: Store, clock: FakeClock) -> None:
    handler = IdempotencyHandler(store, metrics=None, clock=clock, lease_timeout=LEASE)
    tokens: list[int] = []
    with pytest.raises(Abandon):
        handler.run(lambda: _walk_away(tokens), **SCOPE, payload={"n": 1})
    record = handler.get_record(**SCOPE)
    assert record is not None and record.status is Status.PROCESSING
    assert (record.fencing_token, record.lease_expires_at) == (tokens[0], clock.now + LEASE)
    assert handler.retry_count(**SCOPE) == 0  # nothing counted until someone takes over
    assert handler.run(lambda: "too soon", **SCOPE, payload={"n": 1}).kind == "in_progress"
    clock.advance(LEASE + 1)
    taken = handler.run(lambda: "ran again", **SCOPE, payload={"n": 1})
    assert (taken.kind, taken.result, taken.retry_count) == ("executed", "ran again", 1)
    assert taken.fencing_token is not None and taken.fencing_token > tokens[0]


def test_simulate_crash_leaves_what_abandon_leaves(clock: FakeClock) -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock)
    token = simulate_crash(handler, **SCOPE, lease_timeout=LEASE)
    record = handler.get_record(**SCOPE)
    assert record is not None and record.status is Status.PROCESSING
    assert (record.fencing_token, record.lease_expires_at) == (token, clock.now + LEASE)
    busy = simulate_crash(handler, **SCOPE)  # a live lease: the claim is refused
    assert not isinstance(busy, int) and busy.kind == "in_progress"


def test_abandon_on_the_event_loop_writes_nothing(clock: FakeClock) -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=LEASE)
    tokens: list[int] = []

    async def body() -> None:
        _walk_away(tokens)

    with pytest.raises(Abandon):
        asyncio.run(handler.run_async(body, **SCOPE))
    record = handler.get_record(**SCOPE)
    assert record is not None and record.status is Status.PROCESSING
    assert record.fencing_token == tokens[0]
    handler.close()


def test_abandon_mid_batch_leaves_the_claims_not_yet_recorded(clock: FakeClock) -> None:
    """As a worker killed mid-batch: what was recorded stays, the rest stays PROCESSING."""
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock)
    calls = [{**SCOPE, "key": f"k-{i}"} for i in range(3)]

    def body(call: dict[str, str]) -> str:
        if call["key"] == "k-1":
            raise Abandon()
        return call["key"]

    with pytest.raises(Abandon):
        handler.run_many(calls, body)
    statuses = [handler.get_record(**call) for call in calls]
    assert [r.status if r else None for r in statuses] == [
        Status.SUCCESS, Status.PROCESSING, Status.PROCESSING
    ]
