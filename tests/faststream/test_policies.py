"""The per-operation policies as FastStream options, behind the middleware and with the
decorator, on every broker: ``on_success="reject"`` makes a duplicate of a success a
``rejected`` dead letter with ``DUPLICATE_REJECTED`` — the body ran once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler, MemoryStore
from idempotent_tasks.faststream import IdempotencyMiddleware, idempotent

from ._harness import MODES, running
from ._kits import Kit

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("mode", MODES)
def test_on_success_reject_dead_letters_a_duplicate_of_a_success(
    kit: Kit, handler: IdempotencyHandler, mode: str
) -> None:
    calls: list[Any] = []

    async def charge(body: dict[str, Any]) -> str:
        calls.append(body)
        return "charged"

    async def scenario() -> None:
        dest, dead = kit.destination(), kit.destination("dead")
        async with running(kit, handler, {dest: charge}, mode=mode, dead_letter=dead,
                           on_success="reject") as r:
            await r.publish(dest, {"n": 1})
            await r.until(lambda: r.kinds() == ["executed"])
            await r.publish(dest, {"n": 1})
            await r.dead.wait(1)
            await r.until(lambda: len(r.kinds()) == 2)
        assert r.kinds() == ["executed", "rejected"]
        assert r.outcomes[1][1].error_code is ErrorCode.DUPLICATE_REJECTED
        assert r.dead.items[0][1]["idempotency-error-code"] == "DUPLICATE_REJECTED"
        assert calls == [{"n": 1}]
        assert handler.options_for("orders.charge").on_success == "reject"

    asyncio.run(scenario())


def test_a_bad_policy_is_refused_at_construction() -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    with pytest.raises(ConfigurationError, match="on_in_progress"):
        IdempotencyMiddleware(handler, on_in_progress="never")
    with pytest.raises(ConfigurationError, match="reuse_after"):
        idempotent(handler, reuse_after=-5)
