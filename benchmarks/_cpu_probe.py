"""The probe the ``cpu`` section runs under ``valgrind --tool=callgrind`` (see ``cpu.py``).

``python _cpu_probe.py MODE N METRICS [WARMUP]``: builds
``IdempotencyHandler(MemoryStore(), metrics=METRICS)`` (``METRICS``: ``auto`` = the default,
Prometheus; ``none`` = ``metrics=None``), runs ``WARMUP`` first deliveries (fixed, whatever
``N``), then ``N`` first deliveries (``MODE`` ``first``: a fresh key each) or ``N`` replays
(``MODE`` ``replay``: one key that already succeeded), and prints where the package was
imported from.  Run with two values of ``N``, the difference of the instruction counts over
the difference of ``N`` is the cost of one delivery: the interpreter's start-up, the imports,
building the handler and the warm-up are the same in both runs and cancel out.

Only the public API that every version of the library has is used (``IdempotencyHandler(store,
metrics=...)``, ``MemoryStore()``, ``handler.execute(...)``), so the same probe runs against an
older checkout put first on ``PYTHONPATH``.  Standalone on purpose: it imports nothing from
``benchmarks``.
"""

from __future__ import annotations

import sys


def body() -> dict[str, bool]:
    return {"ok": True}


def main(argv: list[str]) -> None:
    mode, n, metrics_arg = argv[0], int(argv[1]), argv[2]
    warmup = int(argv[3]) if len(argv) > 3 else 200
    import idempotent_tasks
    from idempotent_tasks import IdempotencyHandler, MemoryStore

    metrics = {"auto": "auto", "none": None}[metrics_arg]
    handler = IdempotencyHandler(MemoryStore(), metrics=metrics)
    execute = handler.execute
    payload = {"amount": 100}
    for i in range(warmup):
        execute(body, operation="bench", tenant="t", key=f"warm-{i}", payload=payload)
    if mode == "first":
        for i in range(n):
            execute(body, operation="bench", tenant="t", key=f"k-{i}", payload=payload)
    elif mode == "replay":
        execute(body, operation="bench", tenant="t", key="done", payload=payload)
        for _ in range(n):
            execute(body, operation="bench", tenant="t", key="done", payload=payload)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"package: {idempotent_tasks.__file__}")


if __name__ == "__main__":
    main(sys.argv[1:])
