"""Timing helpers: medians of batches, in microseconds per operation.

The machine is shared and noisy, so every comparison in the runner is *interleaved*: small
batches of each contender alternate (``interleave``), and a ratio is the median of the ratios
of adjacent batches (noise that hits one batch hits its neighbour alike).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Op = Callable[[int], None]


def per_op_us(fn: Op, n: int, batches: int = 5) -> float:
    """Median over ``batches`` of the per-op time of ``fn(i)`` for ``n`` fresh indices."""
    samples = []
    offset = 0
    for _ in range(batches):
        start = time.perf_counter()
        for i in range(offset, offset + n):
            fn(i)
        samples.append((time.perf_counter() - start) / n * 1e6)
        offset += n
    return statistics.median(samples)


def _batch_us(fn: Op, start: int, size: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + size):
        fn(i)
    return (time.perf_counter() - t0) / size * 1e6


@dataclass
class Interleaved:
    """Per-batch samples (µs/op) of several contenders measured in alternation."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def ratio(self, name: str, reference: str) -> float:
        """Median of the paired per-batch ratios ``name / reference``."""
        pairs = zip(self.samples[name], self.samples[reference], strict=True)
        return statistics.median(a / b for a, b in pairs)

    def medians(self) -> dict[str, float]:
        return {name: round(self.median(name), 2) for name in self.samples}


def interleave(ops: Mapping[str, Op], n: int, batch: int = 25, warmup: int = 50) -> Interleaved:
    """Run every op of ``ops`` for ``n`` fresh indices each, in alternating batches of
    ``batch``; ``warmup`` calls of each first (statement preparation, script loading).
    The garbage collector is paused during a batch (and run between rounds), as timeit does.
    The order rotates from round to round, so no contender always runs first after the
    collection (cold caches, a CPU woken from idle)."""
    result = Interleaved({name: [] for name in ops})
    for fn in ops.values():
        for i in range(-warmup, 0):
            fn(i - 10_000_000)
    order = list(ops.items())
    gc_was_enabled = gc.isenabled()
    try:
        for start in range(0, max(n, batch), batch):
            gc.collect()
            gc.disable()
            for name, fn in order:
                result.samples[name].append(_batch_us(fn, start, batch))
            order.append(order.pop(0))
            if gc_was_enabled:
                gc.enable()
    finally:
        if gc_was_enabled:
            gc.enable()
    return result


def median_of(fn: Callable[[], float], runs: int) -> tuple[float, list[float]]:
    """``fn()`` ``runs`` times: the median and every value."""
    values = [fn() for _ in range(runs)]
    return statistics.median(values), values
