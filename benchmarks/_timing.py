"""Small timing helpers: medians of several batches, in microseconds per operation."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_op_us(fn: Callable[[int], None], n: int, batches: int = 5) -> float:
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
