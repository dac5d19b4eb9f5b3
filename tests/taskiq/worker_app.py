"""The taskiq app of the worker-process tests: ``python -m taskiq worker
tests.taskiq.worker_app:broker``.  Configured by the test through the environment:

* ``IT_TASKIQ_BROKER``: ``redis`` (taskiq-redis ``RedisStreamBroker``) or ``rabbit``
  (taskiq-aio-pika ``AioPikaBroker``, ``IT_TASKIQ_AMQP_URL`` on the test's own vhost);
* ``IT_TASKIQ_PREFIX``: the store's key prefix, the result backend's, the stream's name and
  the prefix of every key the bodies write (their effects).

The bodies record their effects in Redis (``<prefix>:effects:<id>``), so the test reads
what really happened whichever process ran them.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis
import redis.asyncio as aioredis
from taskiq_redis import RedisAsyncResultBackend

from idempotent_tasks import IdempotencyHandler, Outcome, RedisStore
from idempotent_tasks.taskiq import IdempotencyMiddleware, idempotent

REDIS_URL = os.environ.get("IT_TASKIQ_REDIS", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("IT_TASKIQ_PREFIX", "it_taskiq_local")
KIND = os.environ.get("IT_TASKIQ_BROKER", "redis")
LEASE = float(os.environ.get("IT_TASKIQ_LEASE", "2"))


def _broker() -> Any:
    backend: Any = RedisAsyncResultBackend(REDIS_URL, prefix_str=f"{PREFIX}:results",
                                           result_ex_time=600)
    if KIND == "rabbit":
        from taskiq_aio_pika import AioPikaBroker

        return AioPikaBroker(os.environ["IT_TASKIQ_AMQP_URL"]).with_result_backend(backend)
    from taskiq_redis import RedisStreamBroker

    return RedisStreamBroker(
        REDIS_URL, queue_name=f"{PREFIX}:stream", consumer_group_name=f"{PREFIX}:group",
        consumer_id="0", idle_timeout=1000, xread_block=200,
    ).with_result_backend(backend)


store = RedisStore(REDIS_URL, prefix=PREFIX)
handler = IdempotencyHandler(store, lease_timeout=LEASE, max_retries=3, metrics=None)
_counter = redis.Redis.from_url(REDIS_URL)


def count_outcome(message: Any, outcome: Outcome) -> None:
    """What the test waits on: ``<prefix>:outcomes:<task id>`` lists each outcome's kind."""
    _counter.rpush(f"{PREFIX}:outcomes:{message.task_id}", outcome.kind)


broker = _broker().with_middlewares(IdempotencyMiddleware(
    handler, default_tenant="acme", retry_backoff=(0.05, 0.2), on_outcome=count_outcome,
))
_redis = aioredis.Redis.from_url(REDIS_URL)


def key(name: str) -> str:
    return f"{PREFIX}:{name}"


@idempotent(broker, task_name="it.charge")
async def charge(order_id: str, amount: int) -> dict[str, Any]:
    """The effect is one INCR.  When the test armed ``block``, the first run records its
    pid and blocks *before* the effect, forever: the test kills it there."""
    if await _redis.getdel(key("block")):
        await _redis.set(key("blocked_pid"), os.getpid())
        await asyncio.Event().wait()
    await _redis.incr(key(f"effects:{order_id}"))
    return {"order_id": order_id, "charged": amount, "pid": os.getpid()}


@idempotent(broker, task_name="it.slow")
async def slow(n: int) -> str:
    """Runs until the test pushes to ``release`` (its second delivery must wait for it)."""
    await _redis.incr(key("slow_runs"))
    await _redis.blpop([key("release")], timeout=60)
    return f"slow-{n}"


@idempotent(broker, task_name="it.flaky")
async def flaky(n: int) -> int:
    attempt = int(await _redis.incr(key("flaky_attempts")))
    if attempt == 1:
        raise ConnectionError("downstream blinked")
    return attempt


@idempotent(broker, task_name="it.strict", permanent=(ValueError,))
async def strict(n: int) -> None:
    await _redis.incr(key("strict_attempts"))
    raise ValueError(f"order {n} is invalid")


@broker.task(task_name="it.ping")
async def ping() -> str:
    return "pong"


@broker.task(task_name="it.unique_gate")
async def unique_gate(name: str) -> str:
    """A plain task (unique enqueue needs no ``@idempotent``): counts its runs, then waits
    until the test pushes to its gate."""
    await _redis.incr(key(f"gate_runs:{name}"))
    await _redis.blpop([key(f"gate:{name}")], timeout=60)
    return f"gate-{name}"
