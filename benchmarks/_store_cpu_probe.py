"""Client CPU of the PostgreSQL and Redis stores against their minimal floors, counted by
callgrind (the method of ``_cpu_probe.py``: two runs of different ``N``, the difference of
the instruction counts over the difference of ``N`` is one operation's cost)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m benchmarks._store_cpu_probe KIND CONTENDER MODE N

``KIND`` ``postgresql`` | ``redis``; ``CONTENDER`` ``minimal`` (the minimal floor's
statements, ``floors.floor_ops(..., minimal=True)``) | ``store`` (``create`` + ``mark_success``) |
``execute`` (the handler, ``metrics=None``); ``MODE`` ``first`` | ``replay``.  Only the
client process is counted (the server's work is not in it).
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from typing import Any

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks._core.records import Scope

from ._services import POSTGRES_URL, REDIS_URL
from .core import open_store
from .floors import _HASH, _RESPONSE, floor_ops


def store_ops(store: Any) -> dict[str, Any]:
    """``first``: ``create`` + ``mark_success`` of a fresh scope; ``replay``: ``create`` of
    one that succeeded."""
    tag = uuid.uuid4().hex[:6]
    now = time.time()

    def first(i: int) -> None:
        scope = Scope("t", "op", f"{tag}-{i}")
        token = store.create(scope, request_hash=_HASH, now=now,
                             lease_expires_at=now + 300).record.fencing_token
        store.mark_success(scope, token=token, response=_RESPONSE, now=now,
                           expires_at=now + 86400)

    first(-1)
    done = Scope("t", "op", f"{tag}--1")

    def replay(_: int) -> None:
        store.create(done, request_hash=_HASH, now=now, lease_expires_at=now + 300)

    return {"first": first, "replay": replay}


def _execute_ops(store: Any) -> dict[str, Any]:
    h = IdempotencyHandler(store, metrics=None)
    tag = uuid.uuid4().hex[:6]

    def first(i: int) -> None:
        h.execute(_body, operation="cpu", tenant="t", key=f"{tag}-{i}", payload={"a": 1})

    first(-1)
    return {"first": first, "replay": lambda _: first(-1)}


def _body() -> dict[str, bool]:
    return {"ok": True}


def main(argv: list[str]) -> None:
    kind, contender, mode, n = argv[0], argv[1], argv[2], int(argv[3])
    with contextlib.ExitStack() as stack:
        if contender == "minimal":
            ops = stack.enter_context(
                floor_ops(kind, None, POSTGRES_URL, REDIS_URL, minimal=True)  # type: ignore[arg-type]
            )
            ops = {"first": ops["claim+complete"], "replay": ops["claim-or-get"]}
        else:
            store = stack.enter_context(open_store(kind, None))  # type: ignore[arg-type]
            ops = store_ops(store) if contender == "store" else _execute_ops(store)
        fn = ops[mode]
        for i in range(-300, 0):  # statements prepared, scripts loaded, caches warm
            fn(i - 1_000_000)
        for i in range(n):
            fn(i)


if __name__ == "__main__":
    main(sys.argv[1:])
