"""The Dramatiq app with *async* actors that worker subprocesses run in
``test_asyncio.py``: RabbitMQ, the ``AsyncIO`` middleware, an SQLite store shared with the
test.  Configured from the environment: ``IT_BROKER_URL`` (the test's own vhost),
``IT_QUEUE``, ``IT_STORE_URL``, ``IT_WORKDIR``, ``IT_LEASE``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import AsyncIO

from idempotent_tasks import IdempotencyHandler, SQLStore, current_context
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor

QUEUE = os.environ["IT_QUEUE"]
WORKDIR = Path(os.environ["IT_WORKDIR"])
FAST: dict[str, Any] = {"min_backoff": 200, "max_backoff": 600, "queue_name": QUEUE}

store = SQLStore(os.environ["IT_STORE_URL"])
handler = IdempotencyHandler(store, lease_timeout=float(os.environ.get("IT_LEASE", "2")))
broker = RabbitmqBroker(url=os.environ["IT_BROKER_URL"])
broker.add_middleware(AsyncIO())
broker.add_middleware(IdempotencyMiddleware(handler, recover_every=0.5, cleanup_every=60))
dramatiq.set_broker(broker)


def _append(name: str, line: str) -> int:
    """Append a line (one write, O_APPEND); returns how many lines the file had before."""
    path = WORKDIR / name
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        f.write(line + "\n")
    return before


@idempotent_actor(**FAST)
async def crashy(order_id: str) -> str:
    """First attempt: signal, then block (on the event loop) until SIGKILLed, *before* the
    effect."""
    ctx = current_context()
    count = await ctx.retry_count_async() if ctx else "?"  # never a blocking read on the loop
    previous = _append("attempts", f"{order_id} {count}")
    if previous == 0:
        (WORKDIR / "started").write_text(str(os.getpid()))
        await asyncio.Event().wait()
    _append("effects", order_id)
    return order_id


@idempotent_actor(**FAST)
async def effect(order_id: str) -> str:
    await asyncio.sleep(0)
    _append("effects", order_id)
    return order_id
