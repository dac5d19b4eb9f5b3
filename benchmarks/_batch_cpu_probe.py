"""Client CPU of a batch, counted by callgrind (``batch_cpu.py`` runs it)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks._batch_cpu_probe KIND OP SIZE BATCHES

``KIND`` ``postgresql`` | ``redis`` | ``memory``; ``OP`` ``claim`` (``store.create_many`` of
fresh scopes), ``both`` (``create_many`` then ``mark_success_many`` of the same scopes, as
a consumer batch with ``batch_completion=True`` calls them) or ``run_many``
(``handler.run_many(..., batch_completion=True)``, ``metrics=None``: the engine's batch
path with the store calls in it).  ``BATCHES`` batches of ``SIZE`` scopes each, after the
same warm-up whatever ``SIZE`` is; two runs of different ``SIZE`` give one scope's cost as
the difference of their counts over ``BATCHES * ΔSIZE`` (start-up, imports, the warm-up and
each batch's fixed cost cancel out).  Only the client process is counted.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import idempotent_tasks
from idempotent_tasks import IdempotencyHandler
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import ClaimRequest, SuccessWrite

from .core import open_store

HASH = "a" * 64
RESPONSE = b'{"ok":true}'
WARMUP = 5


def store_batch(store: Any, op: str, size: int) -> Callable[[int], None]:
    """One batch of ``size`` fresh scopes: claimed, and completed when ``op`` is ``both``."""
    tag = uuid.uuid4().hex[:6]

    def batch(b: int) -> None:
        now = time.time()
        claims = [ClaimRequest(Scope("acme", "orders", f"{tag}-{b}-{i}"), HASH)
                  for i in range(size)]
        results = store.create_many(claims, now=now, lease_expires_at=now + 300)
        assert all(r.created for r in results)
        if op == "both":
            writes = [SuccessWrite(c.scope, r.record.fencing_token, RESPONSE, now + 86400)
                      for c, r in zip(claims, results, strict=True)]
            assert all(store.mark_success_many(writes, now=now))

    return batch


def handler_batch(store: Any, size: int) -> Callable[[int], None]:
    """One ``run_many`` of ``size`` fresh calls with ``batch_completion=True``."""
    handler = IdempotencyHandler(store, metrics=None)
    tag = uuid.uuid4().hex[:6]

    def batch(b: int) -> None:
        calls = [{"operation": "orders", "tenant": "acme", "key": f"{tag}-{b}-{i}",
                  "payload": {"n": i}} for i in range(size)]
        outcomes = handler.run_many(calls, _body, batch_completion=True)
        assert all(o.kind == "executed" for o in outcomes), outcomes[0]

    return batch


def _body(call: Any) -> dict[str, bool]:
    return {"ok": True}


def main(argv: list[str]) -> None:
    kind, op, size, batches = argv[0], argv[1], int(argv[2]), int(argv[3])
    print(f"package: {idempotent_tasks.__file__}")
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(open_store(kind, None))  # type: ignore[arg-type]
        batch = handler_batch(store, size) if op == "run_many" else store_batch(store, op, size)
        warm = handler_batch(store, 100) if op == "run_many" else store_batch(store, op, 100)
        for b in range(WARMUP):  # statements prepared, scripts loaded, caches warm
            warm(-1 - b)
        for b in range(batches):
            batch(b)


if __name__ == "__main__":
    main(sys.argv[1:])
