"""RedisStore against the raw Redis floor, in one process and one run.

* first delivery: ``RedisStore.create`` + ``mark_success`` (under the token the claim script
  drew from the shard's counter key) vs the floor "one EVALSHA claim-or-get + one
  ``SET XX``" (the same statements as ``benchmarks.floors.redis_floor_fns``; no counter);
* replay: ``RedisStore.create`` on an existing SUCCESS record (the claim script returns the
  record) vs the one-EVALSHA claim-or-get floor;
* batch: ``create_many`` of 100 fresh scopes per call, in scopes per second.

The machine is shared and noisy, so floor and store are *interleaved*: small batches of
each alternate for ``-n`` iterations in total; the medians of the batch means are compared,
and so is the median of the paired per-batch ratios (noise hits both sides alike).
Run: ``python -m benchmarks.redis_floor_probe``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import ClaimRequest
from idempotent_tasks.stores.redis import RedisStore

from .floors import _REDIS_CLAIM

HASH = "a" * 64
RESPONSE = b'{"ok":true}'
BATCH = 25


def interleaved(
    floor: Callable[[int], None], ours: Callable[[int], None], n: int
) -> tuple[float, float, float]:
    """Run ``floor`` and ``ours`` in alternating batches of ``BATCH``: the median batch
    means (µs/op) of each and the median of the paired per-batch ratios ours/floor."""
    samples: tuple[list[float], list[float]] = ([], [])
    for start in range(0, n, BATCH):
        for fn, out in ((floor, samples[0]), (ours, samples[1])):
            t0 = time.perf_counter()
            for i in range(start, start + BATCH):
                fn(i)
            out.append((time.perf_counter() - t0) / BATCH * 1e6)
    ratios = [b / a for a, b in zip(*samples, strict=True)]
    return (
        statistics.median(samples[0]),
        statistics.median(samples[1]),
        statistics.median(ratios),
    )


def measure(url: str, store: RedisStore, n: int) -> dict[str, tuple[float, float, float]]:
    import redis

    client: Any = redis.Redis.from_url(url)
    script = client.register_script(_REDIS_CLAIM)
    tag = uuid.uuid4().hex[:8]
    raw = f"floor:{tag}"
    now = time.time()
    done = Scope("acme", "payments.charge", f"{tag}-done")
    token = store.create(done, request_hash=HASH, now=now,
                         lease_expires_at=now + 300).record.fencing_token
    store.mark_success(done, token=token, response=RESPONSE, now=now, expires_at=now + 86400)
    script(keys=[f"{raw}:done"], args=[b"PROCESSING|" + HASH.encode(), 600_000])

    def floor_first(i: int) -> None:
        key = f"{raw}:{i}"
        script(keys=[key], args=[b"PROCESSING|" + HASH.encode(), 600_000])
        client.set(key, b'SUCCESS|{"ok":true}', xx=True, px=600_000)

    def floor_replay(_: int) -> None:
        script(keys=[f"{raw}:done"], args=[b"PROCESSING", 600_000])

    def first(i: int) -> None:
        scope = Scope("acme", "payments.charge", f"{tag}-{i}")
        token = store.create(scope, request_hash=HASH, now=now,
                             lease_expires_at=now + 300).record.fencing_token
        store.mark_success(scope, token=token, response=RESPONSE, now=now,
                           expires_at=now + 86400)

    def replay(_: int) -> None:
        store.create(done, request_hash=HASH, now=now, lease_expires_at=now + 300)

    try:
        return {
            "claim+complete": interleaved(floor_first, first, n),
            "claim-or-get": interleaved(floor_replay, replay, n),
        }
    finally:
        for k in client.scan_iter(f"{raw}:*"):
            client.delete(k)
        client.close()


def batch_rate(store: RedisStore, batches: int, size: int = 100) -> float:
    now = time.time()
    tag = uuid.uuid4().hex[:8]
    start = time.perf_counter()
    for b in range(batches):
        claims = [
            ClaimRequest(Scope("acme", "orders", f"{tag}-{b}-{i}"), HASH)
            for i in range(size)
        ]
        store.create_many(claims, now=now, lease_expires_at=now + 300)
    return batches * size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=3000, help="iterations of each side")
    opts = parser.parse_args()
    store = RedisStore(opts.url, prefix=f"probe_{uuid.uuid4().hex[:8]}")
    store.create_schema()
    try:
        figures = measure(opts.url, store, opts.n)
        rate = batch_rate(store, 50)
    finally:
        store.drop_schema()
        store.close()
    for name, (floor, mine, paired) in figures.items():
        print(
            f"{name:15} floor {floor:7.1f} µs/op  RedisStore {mine:7.1f} µs/op  "
            f"ratio of medians {mine / floor:.2f}  median paired ratio {paired:.2f}"
        )
    print(f"create_many(100 per call): {rate:,.0f} scopes/s")


if __name__ == "__main__":
    main()
