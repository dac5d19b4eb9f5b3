"""A FastStream subscriber process for the crash test: ``python -m tests.faststream.crash_app``.

RabbitMQ on the test's vhost (``IT_FS_AMQP_URL``), queue ``IT_FS_QUEUE``, a Redis store with
prefix ``IT_FS_PREFIX`` and a 2 s lease.  The body records each attempt in Redis; the first
one records its pid and blocks *before* the effect, until the test SIGKILLs the process.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio as aioredis
from faststream.rabbit import RabbitBroker, RabbitQueue

from idempotent_tasks import AsyncRedisStore, IdempotencyHandler
from idempotent_tasks.faststream import IdempotencyMiddleware

REDIS_URL = os.environ.get("IT_FS_REDIS", "redis://127.0.0.1:6379/0")
PREFIX = os.environ["IT_FS_PREFIX"]
QUEUE = os.environ["IT_FS_QUEUE"]


async def main() -> None:
    effects = aioredis.Redis.from_url(REDIS_URL)
    handler = IdempotencyHandler(AsyncRedisStore(REDIS_URL, prefix=PREFIX), lease_timeout=2)
    broker = RabbitBroker(os.environ["IT_FS_AMQP_URL"], middlewares=[
        IdempotencyMiddleware(handler, operation="orders.charge", retry_backoff=(0.1, 0.3)),
    ])

    @broker.subscriber(RabbitQueue(QUEUE, durable=True))
    async def charge(order: dict[str, Any]) -> str:
        attempt = await effects.incr(f"{PREFIX}:attempts")
        if attempt == 1:
            await effects.set(f"{PREFIX}:blocked_pid", os.getpid())
            await asyncio.Event().wait()  # killed here, before the effect
        await effects.incr(f"{PREFIX}:effects")
        return "charged"

    async with broker:
        await broker.start()
        await effects.set(f"{PREFIX}:ready:{os.getpid()}", 1)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
