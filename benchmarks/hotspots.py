"""Where the time goes between the raw floor and ``execute()`` (``--only hotspots``).

Each probe interleaves, in one run, the floor, the store primitive alone, the same server-side
work sent by hand (so Python and server costs separate), and ``execute()``:

* Redis first delivery: floor | the store's own two Lua scripts sent by hand (keys built
  as the store builds them; the claim script draws the fencing token from the shard's
  counter key and returns it, the success script is sent with it) |
  ``RedisStore.create`` + ``mark_success`` through the client's ``execute_command`` (a
  pool checkout per call: the store before its held per-thread connections) | the same on
  the store's held connection (as shipped) | ``execute()``.
* PostgreSQL replay: floor (``ON CONFLICT DO NOTHING`` CTE) | the store's replacing
  statement (``DO UPDATE … WHERE expired``, run only for expired records) on an existing
  SUCCESS row, sent by hand | the store's hot statement (``DO NOTHING``, its insert guarded
  by ``NOT EXISTS`` so that a replay draws no ``nextval`` from the fencing sequence) sent
  by hand | ``SQLStore.create`` | ``execute()``.  The store's former statement took a row
  lock on every duplicate (``ON CONFLICT DO UPDATE`` locks the conflicting row even when
  its ``WHERE`` is false), which made a replay a write transaction with a WAL flush at
  commit; the store now claims with ``DO NOTHING`` and replaces only expired records in a
  second statement.
* Handler overhead: ``execute()`` on ``MemoryStore`` with metrics on / off (pure Python).
* Consumers' batch mode: one ``create_many`` per batch, then one ``mark_success`` per
  message (single completions) vs one ``mark_success_many`` per batch (as shipped).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyHandler, MemoryStore, RedisStore
from idempotent_tasks._core.records import Scope

from ._services import POSTGRES_DSN, POSTGRES_URL, REDIS_URL
from ._timing import interleave
from .core import PAYLOAD, _body, make_handler, open_store
from .floors import pg_floor_ops, redis_floor_ops

HASH = "a" * 64
RESPONSE = b'{"ok":true}'


def redis_first_delivery(n: int) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_store("redis", Path(tmp)) as store,
        redis_floor_ops(REDIS_URL) as floor,
    ):
        tag = uuid.uuid4().hex[:6]
        handler = make_handler(store)
        now = time.time()
        claim_sha, mark_sha = store._protocol.shas["claim"], store._protocol.shas["mark_success"]
        client = store._transport.client()

        def scripts_by_hand(i: int) -> None:
            k = store._keys(Scope("t", "bench", f"{tag}-raw-{i}"))
            # claim.lua: KEYS record, processing index, the shard's token counter; replies
            # {token} on CREATED (the token as the script formatted it)
            (token,) = client.execute_command(
                "EVALSHA", claim_sha, 3, k.record, k.processing, k.tokens, now, now + 300,
                store._protocol.gc_ms, k.encoded, HASH,
            )
            client.execute_command(
                "EVALSHA", mark_sha, 4, k.record, k.counter, k.processing, k.finished, token,
                RESPONSE, now, now + 86400, store._protocol.gc_ms,
            )

        import redis  # a blocking pool: no held connections, every call through the client

        blocking = redis.BlockingConnectionPool.from_url(REDIS_URL)
        pooled = RedisStore(redis.Redis(connection_pool=blocking), prefix=store.prefix)

        def primitives_on(s: RedisStore, label: str) -> Callable[[int], None]:
            def op(i: int) -> None:
                scope = Scope("t", "bench", f"{tag}-{label}-{i}")
                token = s.create(scope, request_hash=HASH, now=now,
                                 lease_expires_at=now + 300).record.fencing_token
                s.mark_success(scope, token=token, response=RESPONSE, now=now,
                               expires_at=now + 9e4)

            return op

        def execute(i: int) -> None:
            handler.execute(_body, operation="bench", tenant="t", key=f"{tag}-ex-{i}",
                            payload=PAYLOAD)

        result = interleave(
            {"floor": floor["claim+complete"], "scripts by hand": scripts_by_hand,
             "store, pooled client": primitives_on(pooled, "pool"),
             "store create+mark_success": primitives_on(store, "st"), "execute()": execute},
            n,
        )
        return _table(result)


def pg_replay(n: int) -> dict[str, Any]:
    import psycopg

    with (
        tempfile.TemporaryDirectory() as tmp,
        open_store("postgresql", Path(tmp)) as store,
        pg_floor_ops(POSTGRES_URL) as floor,
    ):
        handler = make_handler(store)
        handler.execute(_body, operation="bench", tenant="t", key="done", payload=PAYLOAD)
        call = handler._engine.prepare("bench", "t", "done", PAYLOAD, True)
        assert call is not None
        replacing, hot = store._plans.sql.create, store._plans.sql.claim
        conn = psycopg.connect(POSTGRES_DSN, autocommit=True)
        now = time.time()
        params = {"tenant": "t", "operation": "bench", "key": "done",
                  "request_hash": call.request_hash, "now": now, "lease": now + 300}

        def by_hand(_: int) -> None:
            conn.execute(replacing, params).fetchall()

        def do_nothing(_: int) -> None:
            conn.execute(hot, params).fetchall()

        def create(_: int) -> None:
            store.create(call.scope, request_hash=call.request_hash, now=time.time(),
                         lease_expires_at=now + 300)

        def execute(_: int) -> None:
            handler.execute(_body, operation="bench", tenant="t", key="done", payload=PAYLOAD)

        try:
            result = interleave(
                {"floor": floor["claim-or-get"], "replacing statement by hand": by_hand,
                 "hot statement by hand": do_nothing, "SQLStore.create": create,
                 "execute()": execute},
                n,
            )
        finally:
            conn.close()
        return _table(result)


def handler_overhead(n: int) -> dict[str, Any]:
    store = MemoryStore()
    on = make_handler(store)
    off = IdempotencyHandler(store, metrics=None)
    tag = uuid.uuid4().hex[:6]

    def first_on(i: int) -> None:
        on.execute(_body, operation="bench", tenant="t", key=f"{tag}-on-{i}", payload=PAYLOAD)

    def first_off(i: int) -> None:
        off.execute(_body, operation="bench", tenant="t", key=f"{tag}-off-{i}", payload=PAYLOAD)

    def prepare_only(i: int) -> None:
        on.prepare("bench", "t", f"{tag}-p-{i}", PAYLOAD, True)

    def store_only(i: int) -> None:
        scope = Scope("t", "bench", f"{tag}-s-{i}")
        token = store.create(scope, request_hash=HASH, now=1.0,
                             lease_expires_at=301.0).record.fencing_token
        store.mark_success(scope, token=token, response=RESPONSE, now=1.0, expires_at=9e9)

    result = interleave(
        {"MemoryStore create+mark_success": store_only, "prepare() only": prepare_only,
         "execute() metrics=None": first_off, "execute() Prometheus": first_on},
        n,
    )
    return _table(result, reference="MemoryStore create+mark_success")


def _table(result: Any, reference: str = "floor") -> dict[str, Any]:
    return {
        name: {"us": round(result.median(name), 2),
               "ratio": round(result.ratio(name, reference), 3)}
        for name in result.samples
    }


def run(n: int) -> dict[str, Any]:
    return {
        "redis first delivery": redis_first_delivery(n),
        "postgresql replay": pg_replay(n),
        "handler overhead (memory store, first delivery)": handler_overhead(n),
        **batch_complete(max(n // 100, 5)),
    }


def batch_complete(n_batches: int, size: int = 100) -> dict[str, Any]:
    """Consumers' batch mode claims a batch in one ``create_many`` and records its
    successes in one ``mark_success_many``.  Per scope: create_many + one ``mark_success``
    per message (single completions, as before batching) vs create_many +
    ``mark_success_many`` (as shipped), interleaved batch by batch."""
    return {
        f"{kind}, per scope in batches of {size}": _batch_complete(kind, n_batches, size)
        for kind in ("redis", "postgresql")
    }


def _batch_complete(kind: str, n_batches: int, size: int) -> dict[str, Any]:
    from ._fill import RESPONSE as FILL_RESPONSE
    from ._fill import _complete, scopes
    from ._fill import claim as claim_chunk

    with tempfile.TemporaryDirectory() as tmp, open_store(kind, Path(tmp)) as store:
        pool = scopes(2 * n_batches * size + 2 * size)
        now = time.time()

        def claim(i: int, offset: int) -> list[tuple[Scope, int]]:
            """One ``create_many``: the chunk's scopes with the tokens the store drew."""
            return claim_chunk(store, pool[(2 * i + offset) * size:(2 * i + offset + 1) * size],
                               now)

        def as_is(i: int) -> None:
            for s, token in claim(i, 0):
                store.mark_success(s, token=token, response=FILL_RESPONSE, now=now,
                                   expires_at=now + 86400)

        def batched(i: int) -> None:
            _complete(store, kind, claim(i, 1), now, now + 86400)

        result = interleave({"single completions": as_is, "mark_success_many": batched},
                            n_batches, batch=1, warmup=0)
        return {
            name: {"us": round(result.median(name) / size, 2),
                   "ratio": round(result.ratio(name, "single completions"), 3)}
            for name in ("single completions", "mark_success_many")
        }
