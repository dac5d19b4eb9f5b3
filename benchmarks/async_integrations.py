"""FastStream and taskiq (``--only async_integrations``): messages/s of one consumer with a
trivial body, with and without the idempotency layer, and the cost the layer adds per message
against the async store's claim + complete floor, all measured in this one run.

* FastStream: ``RabbitBroker`` with one consumer at a time (a channel with prefetch 1,
  so the messages are processed one after another and the added time per message is the
  layer's full cost, not hidden by overlap), a queue filled beforehand; the plain subscriber
  and the same subscriber behind ``IdempotencyMiddleware`` on ``AsyncRedisStore``.
* taskiq: taskiq-redis ``RedisStreamBroker``, taskiq's receiver in this process with
  ``max_async_tasks=1``, a stream filled beforehand; a plain ``@broker.task`` and an
  ``@idempotent`` task behind ``IdempotencyMiddleware`` on ``AsyncRedisStore``.
* Rate: (N - 1) / (time between the first and the last body), so start-up is not counted.
  Every message has its own key (first deliveries).  Each round measures the floor, the
  engine, and each integration plain then layered; the figures are medians over rounds of
  what one round measured (the shared machine's load moves within seconds).
* Floor: ``redis.asyncio`` claim script + ``SET XX`` (``asyncio_.redis_floor``), interleaved
  in the same loop.  Added cost per message = 1/rate(layered) - 1/rate(plain); the target is
  added ≤ 1.5 x floor.  ``handler.run_async`` alone (first delivery, trivial body) is measured
  with the floor, so the report also shows what each integration adds beyond the engine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from ._services import OPENED, RABBITMQ_URL, REDIS_URL

PAYLOAD = {"amount": 100, "currency": "EUR"}


class _Clock:
    """When the first and the n-th body ran; ``done`` is set at the n-th."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0
        self.first = self.last = 0.0
        self.done = asyncio.Event()

    def tick(self) -> None:
        now = time.perf_counter()
        self.count += 1
        if self.count == 1:
            self.first = now
        if self.count == self.n:
            self.last = now
            self.done.set()

    def rate(self) -> float:
        return (self.n - 1) / (self.last - self.first)


def _store() -> Any:
    from idempotent_tasks import AsyncRedisStore

    prefix = f"aibench_{uuid.uuid4().hex[:8]}"
    OPENED.append(("redis", prefix))
    return AsyncRedisStore(REDIS_URL, prefix=prefix)


def _handler(store: Any) -> Any:
    from idempotent_tasks import IdempotencyHandler

    return IdempotencyHandler(store, metrics=None)


# --------------------------------------------------------------------------- FastStream
async def _fill_rabbit(url: str, queue: str, n: int, tag: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=False, auto_delete=False)
        for i in range(n):
            await channel.default_exchange.publish(aio_pika.Message(
                b'{"amount": 100, "currency": "EUR"}', content_type="application/json",
                headers={"idempotency-key": f"{tag}-{i}", "idempotency-tenant": "bench"},
            ), routing_key=queue)
    finally:
        await connection.close()


async def _delete_rabbit(url: str, queue: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue)
    finally:
        await connection.close()


async def faststream_rate(n: int, layered: bool) -> float:
    from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

    from idempotent_tasks.faststream import IdempotencyMiddleware

    url = RABBITMQ_URL.rstrip("/") + "/"  # the default vhost, as aio-pika spells it
    queue, tag = f"bench-fs-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    clock, store = _Clock(n), _store() if layered else None
    middlewares = [IdempotencyMiddleware(_handler(store), operation="bench")] if store else []
    broker = RabbitBroker(url, logger=None, default_channel=Channel(prefetch_count=1),
                          middlewares=middlewares)

    @broker.subscriber(RabbitQueue(queue, durable=False, auto_delete=False))
    async def body(order: dict[str, Any]) -> None:
        clock.tick()

    try:
        await _fill_rabbit(url, queue, n, tag)
        async with broker:
            await broker.start()
            await asyncio.wait_for(clock.done.wait(), 600)
    finally:
        await _delete_rabbit(url, queue)
        if store is not None:
            await store.drop_schema()
            await store.close()
    return clock.rate()


# --------------------------------------------------------------------------- taskiq
async def taskiq_rate(n: int, layered: bool) -> float:
    import redis.asyncio as aioredis
    from taskiq.api import run_receiver_task
    from taskiq_redis import RedisStreamBroker

    from idempotent_tasks.taskiq import IdempotencyMiddleware, idempotency_labels, idempotent

    name = f"bench-tq-{uuid.uuid4().hex[:8]}"
    broker: Any = RedisStreamBroker(REDIS_URL, queue_name=name, consumer_group_name=name,
                                    consumer_id="0", xread_block=50)
    clock, store = _Clock(n), _store() if layered else None
    if store is not None:
        broker = broker.with_middlewares(IdempotencyMiddleware(_handler(store)))

    async def work(amount: int, currency: str) -> None:
        clock.tick()

    task: Any = idempotent(broker, task_name="bench")(work) if store else broker.task(
        task_name="bench")(work)
    await broker.startup()
    try:
        for i in range(n):
            kicker = task.kicker()
            if store is not None:
                kicker = kicker.with_labels(**idempotency_labels(f"k-{i}", "bench"))
            await kicker.kiq(**PAYLOAD)
        broker.is_worker_process = True
        receiver = asyncio.create_task(run_receiver_task(broker, max_async_tasks=1))
        try:
            await asyncio.wait_for(clock.done.wait(), 600)
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    finally:
        await broker.shutdown()
        client = aioredis.Redis.from_url(REDIS_URL)
        await client.delete(name)
        await client.aclose()
        if store is not None:
            await store.drop_schema()
            await store.close()
    return clock.rate()


# --------------------------------------------------------------------------- the section
async def _floor_and_engine_us(n: int) -> tuple[float, float]:
    """The floor, and ``handler.run_async`` alone (a first delivery, trivial body) on the same
    store kind, interleaved: what the integrations add beyond the engine is their glue."""
    from .asyncio_ import ainterleave, redis_floor

    store = _store()
    handler = _handler(store)
    tag = uuid.uuid4().hex[:8]

    async def body() -> None:
        return None

    async def engine(i: int) -> None:
        await handler.run_async(body, operation="bench", tenant="bench", key=f"{tag}-{i}",
                                payload=PAYLOAD)

    try:
        async with redis_floor() as floor:
            result = await ainterleave({"floor": floor["claim+complete"], "engine": engine}, n)
    finally:
        await store.drop_schema()
        await store.close()
    return float(result.median("floor")), float(result.median("engine"))


async def _run(n: int, rounds: int) -> dict[str, Any]:
    """Each round: the floor and the engine, then each integration plain and layered on ``n``
    messages.  The machine is shared and its load moves within seconds, so every figure is a
    median over rounds of what was measured *within* one round (the added cost against the
    floor of the same round)."""
    names = {"faststream (RabbitMQ)": faststream_rate, "taskiq (Redis Streams)": taskiq_rate}
    runs: dict[str, list[float]] = {"floor": [], "engine": []}
    for name in names:
        for suffix in (" plain", " ours", " added", " ratio"):
            runs[name + suffix] = []
    for _ in range(rounds):
        floor, engine = await _floor_and_engine_us(300)
        runs["floor"].append(floor)
        runs["engine"].append(engine)
        for name, measure in names.items():
            plain, ours = await measure(n, False), await measure(n, True)
            added = (1 / ours - 1 / plain) * 1e6
            runs[name + " plain"].append(plain)
            runs[name + " ours"].append(ours)
            runs[name + " added"].append(added)
            runs[name + " ratio"].append(added / floor)
    med = {k: statistics.median(v) for k, v in runs.items()}
    out: dict[str, Any] = {
        "messages": n, "rounds": rounds, "floor_us": round(med["floor"], 1),
        "engine_us": round(med["engine"], 1),
        "engine_vs_floor": round(statistics.median(
            e / f for e, f in zip(runs["engine"], runs["floor"], strict=True)), 3),
        "floor_runs": [round(x) for x in runs["floor"]],
    }
    for name in names:
        out[name] = {
            "plain_msgs_per_s": round(med[name + " plain"]),
            "ours_msgs_per_s": round(med[name + " ours"]),
            "added_us_per_msg": round(med[name + " added"], 1),
            "added_vs_floor": round(med[name + " ratio"], 3),
            "glue_us_per_msg": round(med[name + " added"] - med["engine"], 1),
            "ratio_runs": [round(x, 2) for x in runs[name + " ratio"]],
        }
    return out


def run(n: int, rounds: int = 3) -> dict[str, Any]:
    return asyncio.run(_run(n, rounds))


def table(data: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title=(f"async integrations: one consumer, trivial body, {data.get('messages')} "
                     f"messages x {data.get('rounds')} rounds (medians); AsyncRedisStore; "
                     f"floor = redis.asyncio claim + SET XX = {data.get('floor_us')} µs; "
                     f"handler.run_async alone = {data.get('engine_us')} µs "
                     f"({data.get('engine_vs_floor')}x the floor)"))
    for col in ("integration", "plain msg/s", "with layer msg/s", "added µs/msg",
                "added / floor", "beyond the engine µs/msg"):
        t.add_column(col)
    for name in ("faststream (RabbitMQ)", "taskiq (Redis Streams)"):
        row = data.get(name)
        if isinstance(row, dict):
            t.add_row(name, f"{row['plain_msgs_per_s']:,}", f"{row['ours_msgs_per_s']:,}",
                      f"{row['added_us_per_msg']:.0f}", f"{row.get('added_vs_floor', 0):.2f}x",
                      f"{row.get('glue_us_per_msg', 0):.0f}")
    console.print(t)


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    from .report import _check, _get

    return [
        _check(f"{name}: cost added per message vs the async store's claim + complete floor",
               _get(report, "async_integrations", name, "added_vs_floor"), 1.5)
        for name in ("faststream (RabbitMQ)", "taskiq (Redis Streams)")
    ]
