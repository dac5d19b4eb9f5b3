"""A running FastStream broker with idempotent subscribers, for one test.

``Running`` registers each body on its destination either behind the middleware (on a router
of the kit's broker type, so the dead-letter collector stays outside it) or with the
``@idempotent`` decorator, starts the broker, records every outcome, and afterwards checks
that nothing was left unsettled on the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from idempotent_tasks import IdempotencyHandler, Outcome
from idempotent_tasks.consumers import Message
from idempotent_tasks.faststream import IdempotencyMiddleware, idempotent
from tests._wait import budget

from ._kits import Dead, Kit

MODES = ["middleware", "decorator"]


@dataclass
class Running:
    kit: Kit
    broker: Any
    dead: Dead
    outcomes: list[tuple[str, Outcome]] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, message: Message, outcome: Outcome) -> None:
        self.outcomes.append((message.topic or "", outcome))
        self.changed.set()

    def kinds(self) -> list[str]:
        return [o.kind for _, o in self.outcomes]

    async def publish(self, destination: str, body: Any, key: str | None = "k-1",
                      **headers: str) -> None:
        sent = {k.replace("_", "-"): v for k, v in headers.items()}
        if key is not None:
            sent["idempotency-key"] = key
        sent.setdefault("idempotency-tenant", "acme")
        self.published[destination] = self.published.get(destination, 0) + 1
        await self.kit.publish(self.broker, destination, body, sent)

    async def until(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until the outcomes seen so far satisfy ``condition``."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def running(
    kit: Kit,
    handler: IdempotencyHandler,
    bodies: dict[str, Callable[..., Any]],
    *,
    mode: str = "middleware",
    dead_letter: str | None = None,
    **options: Any,
) -> AsyncIterator[Running]:
    """The broker, started, with ``bodies`` (destination → subscriber function)."""
    broker = kit.broker()
    dead = Dead()
    run = Running(kit, broker, dead)
    settings: dict[str, Any] = {
        "operation": "orders.charge", "retry_backoff": (0.05, 0.2), "on_outcome": run.record,
        "dead_letter": dead_letter, "dead_letter_options": kit.dead_letter_options, **options,
    }
    if mode == "middleware":
        router = kit.router(middlewares=[IdempotencyMiddleware(handler, **settings)])
        for destination, fn in bodies.items():
            kit.subscribe(router, destination, fn)
        broker.include_router(router)
    else:
        for destination, fn in bodies.items():
            kit.subscribe(broker, destination, idempotent(handler, **settings)(fn))
    if dead_letter is not None:
        run.dead = kit.collect(broker, dead_letter)
    destinations = [*bodies, *([dead_letter] if dead_letter else [])]
    try:
        async with broker:
            await kit.prepare(broker, destinations)
            await broker.start()
            yield run
            # An outcome is recorded (``on_outcome``) just before FastStream acks its message:
            # a test that stops as soon as it saw the outcome would close the broker in that
            # window, leaving the message pending for a redelivery that never comes in a
            # test.  So, the broker still running, wait until what was delivered is settled.
            await _settled(kit, run, list(bodies))
        # every message of a subscribed destination was acked or dead-lettered
        left = {d: await kit.unsettled(d, run.published.get(d, 0)) for d in bodies}
        assert set(left.values()) == {0}, f"unsettled messages: {left}"
    finally:
        await kit.cleanup(broker, destinations)


async def _settled(kit: Kit, run: Running, destinations: list[str]) -> None:
    """Until the broker has no unsettled message left on ``destinations`` (bounded by the
    test budget; the assertion after the broker closed reports what is left)."""
    deadline = asyncio.get_running_loop().time() + budget(10)
    while asyncio.get_running_loop().time() < deadline:
        left = [await kit.unsettled(d, run.published.get(d, 0)) for d in destinations]
        if not any(left):
            return
        await asyncio.sleep(0.05)  # polling the broker's own count


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a thread hop on the async path")


@contextlib.contextmanager
def no_thread_hop() -> Iterator[None]:
    """While it is active, ``asyncio.to_thread``, ``loop.run_in_executor`` (which
    ``loop.getaddrinfo`` and every executor use) and ``threading.Thread.start`` raise: any
    hop fails the call it belongs to."""
    import threading

    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(asyncio, "to_thread", _refuse)
        mp.setattr(asyncio.base_events.BaseEventLoop, "run_in_executor", _refuse)
        mp.setattr(threading.Thread, "start", _refuse)
        yield
