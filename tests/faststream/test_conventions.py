"""The consumers' conventions through FastStream (keys, tenants, CloudEvents, payload = the
decoded body), results and replies, and the ack-policy corners — on real brokers."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from faststream import AckPolicy, Context
from pydantic import BaseModel

from idempotent_tasks import ErrorCode, IdempotencyHandler, Outcome
from idempotent_tasks.consumers import Message
from idempotent_tasks.faststream import IdempotencyMiddleware, idempotent

from ._harness import running
from ._kits import MESSAGE, Kit, RabbitKit, RedisKit

pytestmark = pytest.mark.timeout(120)
CORRELATION_ID = Context("message.correlation_id")


class Order(BaseModel):
    order_id: str
    amount: int


@pytest.fixture(params=["rabbit", "redis"])
def light_kit(request: pytest.FixtureRequest) -> Kit:
    """The conventions are broker-neutral: two brokers with different header models."""
    if request.param == "rabbit":
        return RabbitKit(request.getfixturevalue("rabbit_vhost_url"))
    return RedisKit()


def test_cloudevents_binary_mode_key_dedupes_resends(light_kit: Kit,
                                                      handler: IdempotencyHandler) -> None:
    calls: list[Any] = []

    async def on_event(body: dict[str, Any]) -> None:
        calls.append(body)

    async def scenario() -> None:
        dest = light_kit.destination()
        async with running(light_kit, handler, {dest: on_event}) as r:
            for count, time in ((1, "t1"), (2, "t2")):  # re-sent: new time, same source + id
                await r.publish(dest, {"n": 1}, key=None, ce_source="/shop", ce_id="e-1",
                                ce_time=time)
                await r.until(lambda n=count: len(r.kinds()) == n)
        assert r.kinds() == ["executed", "replayed"]
        assert r.outcomes[0][1].key == "ce:5:/shope-1"
        assert calls == [{"n": 1}]

    asyncio.run(scenario())


def test_structured_cloudevent_payload_is_its_data(handler: IdempotencyHandler,
                                                   rabbit_vhost_url: str) -> None:
    kit = RabbitKit(rabbit_vhost_url)
    seen: list[Outcome] = []

    async def on_event(msg: Any = MESSAGE) -> str:
        return "ok"

    async def scenario() -> None:
        dest = kit.destination()
        broker = kit.broker()
        broker.subscriber(kit._queue(dest))(idempotent(
            handler, operation="events", default_tenant="acme",
            on_outcome=lambda m, o: seen.append(o))(on_event))
        async with broker:
            await kit.prepare(broker, [dest])
            await broker.start()
            for count, time in ((1, "t1"), (2, "t2")):
                envelope = {"specversion": "1.0", "source": "/shop", "id": "e-9",
                            "time": time, "data": {"order": 7}}
                await broker.publish(json.dumps(envelope).encode(), queue=dest,
                                     content_type="application/cloudevents+json")
                async with asyncio.timeout(20):
                    while len(seen) < count:
                        await asyncio.sleep(0.01)  # polling what the subscriber recorded
        assert [o.kind for o in seen] == ["executed", "replayed"]
        assert seen[0].key == "ce:5:/shope-9"
        record = handler.get_record(operation="events", tenant="acme", key="ce:5:/shope-9")
        assert record is not None and record.response == "ok"

    asyncio.run(scenario())


def test_tenants_separate_key_spaces_and_a_missing_one_is_refused(
    light_kit: Kit, handler: IdempotencyHandler
) -> None:
    calls: list[str] = []

    async def charge(body: dict[str, Any]) -> None:
        calls.append(body["who"])

    async def scenario() -> None:
        dest = light_kit.destination()
        async with running(light_kit, handler, {dest: charge}) as r:
            await r.publish(dest, {"who": "a"}, idempotency_tenant="acme")
            await r.publish(dest, {"who": "a"}, idempotency_tenant="globex")
            await r.until(lambda: len(r.kinds()) == 2)
            await r.publish(dest, {"who": "a"}, idempotency_tenant="")
            await r.until(lambda: len(r.kinds()) == 3)
        assert r.kinds() == ["executed", "executed", "rejected"]
        assert r.outcomes[2][1].error_code in (ErrorCode.MISSING_TENANT, ErrorCode.INVALID_TENANT)
        assert calls == ["a", "a"]

    asyncio.run(scenario())


def test_default_tenant_and_the_typed_body(handler: IdempotencyHandler,
                                           rabbit_vhost_url: str) -> None:
    """The decorated subscriber keeps its signature: a pydantic body and a context argument;
    the payload hashed is the decoded body."""
    kit = RabbitKit(rabbit_vhost_url)
    seen: list[tuple[Message, Outcome]] = []
    got: list[tuple[Order, str]] = []

    async def charge(order: Order, correlation_id: str = CORRELATION_ID) -> dict[str, int]:
        got.append((order, correlation_id))
        return {"charged": order.amount}

    async def scenario() -> None:
        dest = kit.destination()
        broker = kit.broker()
        broker.subscriber(kit._queue(dest))(idempotent(
            handler, operation="orders", default_tenant="solo",
            on_outcome=lambda m, o: seen.append((m, o)))(charge))
        async with broker:
            await kit.prepare(broker, [dest])
            await broker.start()
            reply = await broker.request({"order_id": "o-1", "amount": 3}, queue=dest,
                                         headers={"idempotency-key": "k"}, timeout=10)
            again = await broker.request({"order_id": "o-1", "amount": 3}, queue=dest,
                                         headers={"idempotency-key": "k"}, timeout=10)
        assert json.loads(reply.body) == {"charged": 3}
        assert json.loads(again.body) == {"charged": 3}  # the replay answers the caller too
        assert [o.kind for _, o in seen] == ["executed", "replayed"]
        assert seen[0][1].tenant == "solo"
        assert got[0][0] == Order(order_id="o-1", amount=3) and got[0][1]
        assert len(got) == 1

    asyncio.run(scenario())


def test_manual_ack_policy_is_acked_by_the_decorator(handler: IdempotencyHandler,
                                                     rabbit_vhost_url: str) -> None:
    kit = RabbitKit(rabbit_vhost_url)
    done = asyncio.Event()

    async def charge(body: dict[str, Any]) -> None:
        done.set()

    async def scenario() -> None:
        dest = kit.destination()
        broker = kit.broker()
        broker.subscriber(kit._queue(dest), ack_policy=AckPolicy.MANUAL)(
            idempotent(handler, operation="orders", default_tenant="acme")(charge))
        async with broker:
            await kit.prepare(broker, [dest])
            await broker.start()
            await kit.publish(broker, dest, {"n": 1}, {"idempotency-key": "k"})
            await asyncio.wait_for(done.wait(), 20)
            await asyncio.sleep(0)  # let the wrapper's ack go out
        assert await kit.unsettled(dest, 1) == 0

    asyncio.run(scenario())


def test_ack_first_is_reported_once(handler: IdempotencyHandler, rabbit_vhost_url: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    kit = RabbitKit(rabbit_vhost_url)
    seen: list[str] = []

    async def charge(body: dict[str, Any]) -> None:
        seen.append(body["n"])

    async def scenario() -> None:
        dest = kit.destination()
        broker = kit.broker(middlewares=[IdempotencyMiddleware(handler, default_tenant="a")])
        broker.subscriber(kit._queue(dest), ack_policy=AckPolicy.ACK_FIRST)(charge)
        async with broker:
            await kit.prepare(broker, [dest])
            await broker.start()
            for n in ("1", "2"):
                await kit.publish(broker, dest, {"n": n}, {"idempotency-key": n})
            async with asyncio.timeout(20):
                while len(seen) < 2:
                    await asyncio.sleep(0.01)  # polling what the subscriber recorded

    with caplog.at_level(logging.WARNING, logger="idempotent_tasks"):
        asyncio.run(scenario())
    warnings = [r for r in caplog.records
                if "faststream_message_acked_before_processing" in r.getMessage()]
    assert len(warnings) == 1


def test_a_body_that_cannot_be_decoded_is_rejected(handler: IdempotencyHandler,
                                                   rabbit_vhost_url: str) -> None:
    kit = RabbitKit(rabbit_vhost_url)
    calls: list[Any] = []

    async def charge(body: dict[str, Any]) -> None:
        calls.append(body)

    async def scenario() -> None:
        dest, dead = kit.destination(), kit.destination("dead")
        async with running(kit, handler, {dest: charge}, dead_letter=dead) as r:
            await r.broker.publish(b"{not json", queue=dest, content_type="application/json",
                                   headers={"idempotency-key": "k", "idempotency-tenant": "a"})
            await r.dead.wait(1)
        assert r.kinds() == ["rejected"]
        assert r.dead.items[0][1]["idempotency-error-code"] == "INVALID_PAYLOAD"
        assert r.dead.items[0][0] == b"{not json"
        assert calls == []

    asyncio.run(scenario())


def test_batch_subscribers_are_refused(handler: IdempotencyHandler) -> None:
    """One message is one scope: a batch delivery is refused before anything runs (it stays
    pending on the stream)."""
    import redis.asyncio as aioredis
    from faststream.redis import StreamSub

    kit = RedisKit()
    calls: list[Any] = []

    async def charge(bodies: list[dict[str, Any]]) -> None:
        calls.append(bodies)

    async def scenario() -> None:
        dest = kit.destination()
        broker = kit.broker()
        router = kit.router(middlewares=[IdempotencyMiddleware(handler, default_tenant="a")])
        router.subscriber(stream=StreamSub(dest, group="g", consumer="c", batch=True))(charge)
        broker.include_router(router)
        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        try:
            async with broker:
                await broker.start()
                await broker.publish({"n": 1}, stream=dest, headers={"idempotency-key": "k"})
                async with asyncio.timeout(20):
                    while (await client.xpending(dest, "g"))["pending"] == 0:
                        await asyncio.sleep(0.01)  # polling the stream: delivered, not acked
        finally:
            await client.delete(dest)
            await client.aclose()
        assert calls == []

    asyncio.run(scenario())
