"""Every row of the outcome table, on RabbitMQ, NATS JetStream, Redis Streams and Kafka
(Tansu through aiokafka), behind the middleware and with the decorator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idempotent_tasks import ErrorCode, IdempotencyHandler, RedisStore
from idempotent_tasks.testing import FaultyStore

from ._harness import MODES, running
from ._kits import Kit

pytestmark = pytest.mark.timeout(120)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("mode", MODES)
def test_executed_then_replayed_runs_once(kit: Kit, handler: IdempotencyHandler,
                                           mode: str) -> None:
    calls: list[dict[str, Any]] = []

    async def charge(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body)
        return {"charged": body["amount"]}

    async def scenario() -> None:
        dest = kit.destination()
        async with running(kit, handler, {dest: charge}, mode=mode) as r:
            await r.publish(dest, {"amount": 5})
            await r.until(lambda: r.kinds() == ["executed"])
            await r.publish(dest, {"amount": 5})
            await r.until(lambda: len(r.kinds()) == 2)
            assert r.kinds() == ["executed", "replayed"]
            assert r.outcomes[1][1].result == {"charged": 5}
        assert calls == [{"amount": 5}]

    run(scenario())


def test_in_progress_comes_back_and_is_replayed(kit: Kit, handler: IdempotencyHandler) -> None:
    """A duplicate that arrives while the first delivery's body runs is not run, comes back
    (uncounted) and, once the first one succeeded, is replayed."""
    started, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def slow(body: dict[str, Any]) -> str:
        calls.append("slow")
        started.set()
        await release.wait()
        return "done"

    async def other(body: dict[str, Any]) -> str:
        calls.append("other")
        return "other"

    async def scenario() -> None:
        first, second = kit.destination("a"), kit.destination("b")
        async with running(kit, handler, {first: slow, second: other}) as r:
            await r.publish(first, {"n": 1})
            await asyncio.wait_for(started.wait(), 30)
            await r.publish(second, {"n": 1})
            await r.until(lambda: r.kinds().count("in_progress") >= 2)
            release.set()
            await r.until(lambda: "replayed" in r.kinds())
            kinds = r.kinds()
            assert kinds[-1] == "replayed" and "executed" in kinds
            replay = r.outcomes[-1][1]
            assert replay.result == "done"
        assert calls == ["slow"]

    run(scenario())


def test_transient_failure_is_counted_and_retried(kit: Kit, handler: IdempotencyHandler,
                                                   store: RedisStore) -> None:
    calls: list[int] = []

    async def flaky(body: dict[str, Any]) -> str:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ConnectionError("downstream blinked")
        return "ok"

    async def scenario() -> None:
        dest = kit.destination()
        async with running(kit, handler, {dest: flaky}) as r:
            await r.publish(dest, {"n": 1})
            await r.until(lambda: "executed" in r.kinds())
            assert r.kinds() == ["failed", "executed"]
            assert r.outcomes[0][1].error == "ConnectionError"
        assert calls == [0, 1]
        assert handler.retry_count(operation="orders.charge", tenant="acme", key="k-1") == 1

    run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_permanent_error_is_dead_lettered_once(kit: Kit, handler: IdempotencyHandler,
                                               mode: str) -> None:
    calls: list[int] = []

    async def strict(body: dict[str, Any]) -> str:
        calls.append(1)
        raise ValueError("bad order")

    async def scenario() -> None:
        dest, dead = kit.destination(), kit.destination("dead")
        async with running(kit, handler, {dest: strict}, mode=mode, dead_letter=dead,
                           permanent=(ValueError,)) as r:
            await r.publish(dest, {"n": 1})
            await r.dead.wait(1)
            # the same message again: the store's verdict, the body does not run
            await r.publish(dest, {"n": 1})
            await r.dead.wait(2)
            await r.publish(dest, {"n": 2}, key="k-sentinel")
            await r.until(lambda: r.kinds().count("poisoned") == 3)
            assert r.kinds() == ["poisoned", "poisoned", "poisoned"]
        body, headers = r.dead.items[0]
        assert b'"n"' in body
        assert headers["idempotency-error-code"] == "REQUEST_FAILED"
        assert headers["idempotency-error"] == "ValueError"
        assert headers["idempotency-original-topic"] == dest
        assert headers["idempotency-key"] == "k-1"
        assert r.dead.items[1][1]["idempotency-error-code"] == "REQUEST_FAILED"
        assert calls == [1, 1]

    run(scenario())


def test_invalid_input_is_rejected_to_the_dead_letters(kit: Kit,
                                                        handler: IdempotencyHandler) -> None:
    calls: list[Any] = []

    async def charge(body: dict[str, Any]) -> str:
        calls.append(body)
        return "ok"

    async def scenario() -> None:
        dest, dead = kit.destination(), kit.destination("dead")
        async with running(kit, handler, {dest: charge}, dead_letter=dead) as r:
            await r.publish(dest, {"n": 1}, key=None)          # no key
            await r.publish(dest, {"n": 1}, key="k-1")
            await r.until(lambda: len(r.kinds()) == 2)
            await r.publish(dest, {"n": 2}, key="k-1")         # same key, other payload
            await r.dead.wait(2)
            await r.until(lambda: len(r.kinds()) == 3)
        codes = sorted(h["idempotency-error-code"] for _, h in r.dead.items)
        assert codes == ["KEY_REUSED_WITH_DIFFERENT_REQUEST", "MISSING_KEY"]
        rejected = [o for _, o in r.outcomes if o.kind == "rejected"]
        assert {o.error_code for o in rejected} == {
            ErrorCode.MISSING_KEY, ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST}
        assert calls == [{"n": 1}]

    run(scenario())


def test_store_down_never_runs_the_body_and_the_message_comes_back(
    kit: Kit, store: RedisStore
) -> None:
    faulty = FaultyStore(store)
    handler = IdempotencyHandler(faulty, lease_timeout=5, metrics=None)  # type: ignore[arg-type]
    calls: list[int] = []

    async def charge(body: dict[str, Any]) -> str:
        calls.append(1)
        return "ok"

    async def scenario() -> None:
        dest = kit.destination()
        faulty.fail("*")
        async with running(kit, handler, {dest: charge}) as r:
            await r.publish(dest, {"n": 1})
            await r.until(lambda: r.kinds().count("store_unavailable") >= 2)
            assert calls == []
            faulty.heal()
            await r.until(lambda: "executed" in r.kinds())
        assert set(r.kinds()) == {"store_unavailable", "executed"}
        assert calls == [1]

    run(scenario())


def test_dead_letter_without_a_destination_is_settled(kit: Kit,
                                                       handler: IdempotencyHandler) -> None:
    """No ``dead_letter``: the broker's own way (RabbitMQ reject, NATS term, ack); it never
    loops — a sentinel published after it is processed and nothing came back."""
    async def strict(body: dict[str, Any]) -> str:
        if body["n"] == 1:
            raise ValueError("bad")
        return "ok"

    async def scenario() -> None:
        dest = kit.destination()
        async with running(kit, handler, {dest: strict}, permanent=(ValueError,)) as r:
            await r.publish(dest, {"n": 1})
            await r.until(lambda: r.kinds() == ["poisoned"])
            await r.publish(dest, {"n": 2}, key="k-2")
            await r.until(lambda: "executed" in r.kinds())
            assert r.kinds() == ["poisoned", "executed"]

    run(scenario())
