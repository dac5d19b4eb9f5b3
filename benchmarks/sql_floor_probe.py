"""SQLStore first delivery (``create`` + ``mark_success``) against the raw psycopg floor.

The floor is what any PostgreSQL store must pay at least: a psycopg 3 autocommit
``INSERT … ON CONFLICT DO NOTHING RETURNING`` plus the conditional ``UPDATE``, on the very
table (same indexes) the store writes, with a constant token (the store's claim also draws
its fencing token, ``nextval`` of ``<prefix>_fencing_seq``, in the same statement).  Both
run in this process, interleaved in rounds so that the noise of a shared machine hits both
alike; the figure that matters is the ratio (the requirement is <= 1.5).

    .venv/bin/python benchmarks/sql_floor_probe.py [--n 2000] [--rounds 10] [--url URL]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

import psycopg

from idempotent_tasks import SQLStore
from idempotent_tasks._core.records import Scope

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
HASH = "a" * 64
RESPONSE = b'{"ok":true}'


def timed(fn: Callable[[int], None], start: int, n: int) -> float:
    """µs per call of ``fn(i)`` for ``n`` fresh indices from ``start``."""
    t0 = time.perf_counter()
    for i in range(start, start + n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="iterations per side")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--url", default=URL)
    args = parser.parse_args()

    store = SQLStore(args.url, table_prefix=f"probe_{uuid.uuid4().hex[:8]}")
    store.create_schema()
    table = f"{store.table_prefix}_records"
    dsn = args.url.replace("postgresql+psycopg://", "postgresql://")
    conn = psycopg.connect(dsn, autocommit=True)
    insert = (
        f"INSERT INTO {table} (tenant, operation, key, status, request_hash, fencing_token, "
        "created_at, updated_at, lease_expires_at) "
        "VALUES (%s, %s, %s, 'PROCESSING', %s, %s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING fencing_token"
    )
    update = (
        f"UPDATE {table} SET status = 'SUCCESS', response = %s, updated_at = %s, "
        "expires_at = %s, lease_expires_at = NULL WHERE tenant = %s AND operation = %s "
        "AND key = %s AND status = 'PROCESSING' AND fencing_token = %s"
    )

    def floor(i: int) -> None:
        key = f"floor-{i}"
        conn.execute(insert, ("t", "op", key, HASH, 7, 1.0, 1.0, 31.0)).fetchone()
        conn.execute(update, (RESPONSE, 2.0, 99.0, "t", "op", key, 7))

    def through_store(i: int) -> None:
        scope = Scope("t", "op", f"store-{i}")
        claimed = store.create(scope, request_hash=HASH, now=1.0, lease_expires_at=31.0)
        assert claimed.created
        token = claimed.record.fencing_token
        assert store.mark_success(scope, token=token, response=RESPONSE, now=2.0, expires_at=99.0)

    def replay(i: int) -> None:
        scope = Scope("t", "op", "store-0")
        store.create(scope, request_hash=HASH, now=3.0, lease_expires_at=33.0)

    try:
        warm = 200  # let psycopg prepare the statements on both sides
        timed(floor, -warm, warm)
        timed(through_store, -warm, warm)
        per_round = max(1, args.n // args.rounds)
        floors, stores, replays = [], [], []
        for r in range(args.rounds):
            floors.append(timed(floor, r * per_round, per_round))
            stores.append(timed(through_store, r * per_round, per_round))
            replays.append(timed(replay, r * per_round, per_round))
        f, s, d = (statistics.median(x) for x in (floors, stores, replays))
        total = per_round * args.rounds
        print(f"iterations per side: {total} ({args.rounds} interleaved rounds)")
        print(f"raw psycopg INSERT ON CONFLICT + UPDATE : {f:7.1f} µs/op")
        print(f"SQLStore create + mark_success          : {s:7.1f} µs/op")
        print(f"ratio store / floor                     : {s / f:7.2f}  (requirement <= 1.5)")
        print(f"SQLStore create on an existing key      : {d:7.1f} µs/op (replay claim-or-get)")
    finally:
        conn.close()
        store.drop_schema()
        store.close()


if __name__ == "__main__":
    main()
