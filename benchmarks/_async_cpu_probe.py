"""Client instructions of the async stores against the same driver's floor, counted by
callgrind (the method of ``_cpu_probe.py``: two runs of different ``N``, the difference of
the instruction counts over the difference of ``N`` is one operation's cost)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks._async_cpu_probe KIND CONTENDER MODE N

``KIND`` ``redis`` (``AsyncRedisStore``, floor on ``redis.asyncio``) | ``asyncpg``
(``AsyncSQLStore`` on a ``postgresql://`` URL, floor on an asyncpg connection);
``CONTENDER`` ``floor`` (the floor's statements, as ``asyncio_.py`` sends them) | ``store``
(``create`` + ``mark_success``; replay: ``create`` of a key that succeeded) | ``execute``
(``await handler.execute_async(...)``, ``metrics=None``); ``MODE`` ``first`` | ``replay``.
Deliveries run one after the other on one event loop; only the client process is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ._services import POSTGRES_URL, REDIS_URL
from .asyncio_ import AOp, redis_floor
from .floors import _CLAIM_OR_GET, _HASH, _INSERT, _RESPONSE, _UPDATE

ASYNCPG_URL = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")


@contextlib.asynccontextmanager
async def asyncpg_floor(table: str) -> AsyncIterator[dict[str, AOp]]:
    """``asyncio_.pg_floor``'s statements on one asyncpg connection."""
    import asyncpg

    conn = await asyncpg.connect(ASYNCPG_URL)
    insert, update = _INSERT.format(t=table, p="$%d"), _UPDATE.format(t=table, p="$%d")
    insert = insert % tuple(range(1, 9))
    update = update % tuple(range(1, 8))
    claim_or_get = _CLAIM_OR_GET.format(t=table).replace("%s", "$%d") % tuple(range(1, 12))
    tag = f"floor-{uuid.uuid4().hex[:6]}"

    async def first(i: int) -> None:
        key = f"{tag}-{i}"
        await conn.fetchrow(insert, "t", "op", key, _HASH, 7, 1.0, 1.0, 2.0)
        await conn.execute(update, _RESPONSE, 1.0, 9.0, "t", "op", key, 7)

    async def replay(_: int) -> None:
        await conn.fetchrow(claim_or_get, "t", "op", "done", _HASH, 8, 1.0, 1.0, 2.0,
                            "t", "op", "done")

    await conn.fetchrow(insert, "t", "op", "done", _HASH, 7, 1.0, 1.0, 2.0)
    await conn.execute(update, _RESPONSE, 1.0, 9.0, "t", "op", "done", 7)
    try:
        yield {"claim+complete": first, "claim-or-get": replay}
    finally:
        await conn.close()


def _store_ops(store: Any) -> dict[str, Any]:
    """The store's own calls of a delivery, without the handler."""
    from idempotent_tasks._core.records import Scope

    tag, now = uuid.uuid4().hex[:6], 1.0e9

    async def first(i: int) -> None:
        scope = Scope("t", "op", f"{tag}-{'done' if i == -1 else i}")
        created = await store.create(scope, request_hash=_HASH, now=now,
                                     lease_expires_at=now + 300)
        await store.mark_success(scope, token=created.record.fencing_token,
                                 response=_RESPONSE, now=now, expires_at=now + 86400)

    async def replay(_: int) -> None:
        await store.create(Scope("t", "op", f"{tag}-done"), request_hash=_HASH, now=now,
                           lease_expires_at=now + 300)

    return {"first": first, "replay": replay}


async def _body() -> dict[str, bool]:
    return {"ok": True}


async def main(kind: str, contender: str, mode: str, n: int) -> None:
    from idempotent_tasks import AsyncRedisStore, AsyncSQLStore, IdempotencyHandler

    prefix = f"aprobe_{uuid.uuid4().hex[:8]}"
    store: Any = (
        AsyncSQLStore(ASYNCPG_URL, table_prefix=prefix) if kind == "asyncpg"
        else AsyncRedisStore(REDIS_URL, prefix=prefix)
    )
    await store.create_schema()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if contender == "floor":
                floor = await stack.enter_async_context(
                    asyncpg_floor(f"{prefix}_records") if kind == "asyncpg" else redis_floor()
                )
                ops = {"first": floor["claim+complete"], "replay": floor["claim-or-get"]}
            elif contender == "store":
                ops = _store_ops(store)
                await ops["first"](-1)  # what the replays find
            else:
                h = IdempotencyHandler(store, metrics=None)
                tag = uuid.uuid4().hex[:6]

                async def first(i: int) -> None:
                    await h.execute_async(_body, operation="cpu", tenant="t",
                                          key=f"{tag}-{i}", payload={"a": 1})

                ops = {"first": first, "replay": lambda _: first(-1)}
            fn = ops[mode]
            for i in range(-300, 0):  # statements prepared, scripts loaded, caches warm
                await fn(i - 1_000_000)
            for i in range(n):
                await fn(i)
    finally:
        await store.drop_schema()
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
