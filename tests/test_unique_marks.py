"""The pending-message marks of unique enqueue, at the handler, on every store.

``acquire_unique`` / ``release_unique`` are the only calls the integrations' ``enqueue_unique``
make; what they guarantee (one holder, a lease, owner-checked release) is checked here once
per store, with the handler's fake clock moving the leases.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from idempotent_tasks import ConfigurationError, IdempotencyHandler, InvalidInputError
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock
from tests._async_stores import ASYNC_STORE_KINDS, new_async_store
from tests._race import at_once

LEASE = 30.0


@pytest.fixture
def handler(store: Store, clock: FakeClock) -> IdempotencyHandler:
    return IdempotencyHandler(store, metrics=None, clock=clock, lease_timeout=LEASE,
                              on_stuck="fail")


def test_one_holder_until_it_releases(handler: IdempotencyHandler) -> None:
    first = handler.acquire_unique("reports.build", "acme", "r-1")
    second = handler.acquire_unique("reports.build", "acme", "r-1")
    assert first.acquired and not second.acquired
    assert (second.token, second.message_id) == (first.token, first.message_id)
    assert handler.acquire_unique("reports.build", "acme", "r-2").acquired  # another key
    assert handler.acquire_unique("reports.build", "other", "r-1").acquired  # another tenant

    assert handler.release_unique(first)
    third = handler.acquire_unique("reports.build", "acme", "r-1")
    assert third.acquired and third.token > first.token
    assert third.message_id != first.message_id


def test_the_mark_has_its_own_scope(handler: IdempotencyHandler) -> None:
    """The task's own records (its name as the operation) never meet its marks."""
    mark = handler.acquire_unique("reports.build", "acme", "r-1")
    assert mark.operation == "enqueue:reports.build"
    assert handler.get_record(operation="reports.build", tenant="acme", key="r-1") is None
    assert handler.run(lambda: 1, operation="reports.build", tenant="acme", key="r-1").kind == (
        "executed"
    )


def test_an_expired_lease_is_taken_over_and_a_stale_release_changes_nothing(
    handler: IdempotencyHandler, clock: FakeClock
) -> None:
    crashed = handler.acquire_unique("reports.build", "acme", "r-1", lease_timeout=5)
    clock.advance(4.9)
    assert not handler.acquire_unique("reports.build", "acme", "r-1").acquired
    clock.advance(0.2)
    newer = handler.acquire_unique("reports.build", "acme", "r-1")
    assert newer.acquired and newer.token > crashed.token

    assert not handler.release_unique(crashed)  # the stale holder's token: no-op
    still = handler.acquire_unique("reports.build", "acme", "r-1")
    assert not still.acquired and still.token == newer.token
    assert handler.release_unique(newer)


def test_the_lease_defaults_to_the_operations(
    handler: IdempotencyHandler, clock: FakeClock
) -> None:
    handler.register_operation("reports.build", lease_timeout=2)
    mark = handler.acquire_unique("reports.build", "acme", "r-1")
    assert mark.lease_expires_at == pytest.approx(clock() + 2)
    clock.advance(2.1)
    assert handler.acquire_unique("reports.build", "acme", "r-1").acquired


def test_a_mark_settled_by_recovery_is_claimed_again(
    handler: IdempotencyHandler, clock: FakeClock
) -> None:
    """An expired mark looks like a stuck record: recovery may poison it (here
    ``on_stuck="fail"``); the next producer deletes that leftover and claims the scope."""
    handler.acquire_unique("reports.build", "acme", "r-1")
    clock.advance(LEASE + 1)
    assert handler.recover_stuck_records() == 1
    assert handler.get_record(operation="enqueue:reports.build", tenant="acme", key="r-1")
    assert handler.acquire_unique("reports.build", "acme", "r-1").acquired


def test_concurrent_producers_get_one_holder(handler: IdempotencyHandler) -> None:
    marks = at_once(16, lambda: handler.acquire_unique("reports.build", "acme", "r-1"))
    assert sum(mark.acquired for mark in marks) == 1
    assert len({mark.message_id for mark in marks}) == 1


def test_the_async_twins(handler: IdempotencyHandler) -> None:
    async def scenario() -> None:
        first = await handler.acquire_unique_async("reports.build", "acme", "r-1")
        second = await handler.acquire_unique_async("reports.build", "acme", "r-1")
        assert first.acquired and not second.acquired and second.token == first.token
        assert await handler.release_unique_async(first)
        assert not await handler.release_unique_async(first)

    asyncio.run(scenario())


@pytest.mark.parametrize("store_kind", ["memory"], indirect=True)
def test_bad_arguments_are_refused(handler: IdempotencyHandler) -> None:
    with pytest.raises(ConfigurationError):
        handler.acquire_unique("reports.build", "acme", "r-1", lease_timeout=0)
    with pytest.raises(InvalidInputError):
        handler.acquire_unique("reports.build", "acme", "")


@pytest.mark.parametrize("kind", ASYNC_STORE_KINDS)
def test_on_an_async_store_the_async_twins_work_and_the_sync_names_refuse(kind: str) -> None:
    async def scenario() -> None:
        store = new_async_store(kind, f"it_{uuid.uuid4().hex[:10]}")
        await store.create_schema()
        handler = IdempotencyHandler(store, metrics=None)
        try:
            first = await handler.acquire_unique_async("reports.build", "acme", "r-1")
            second = await handler.acquire_unique_async("reports.build", "acme", "r-1")
            assert first.acquired and not second.acquired and second.token == first.token
            with pytest.raises(ConfigurationError, match="acquire_unique_async"):
                handler.acquire_unique("reports.build", "acme", "r-1")
            with pytest.raises(ConfigurationError, match="release_unique_async"):
                handler.release_unique(first)
            assert await handler.release_unique_async(first)
        finally:
            await store.drop_schema()
            await store.close()

    asyncio.run(scenario())
