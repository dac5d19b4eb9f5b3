"""Run the ledger under fire: several workers deliver every charge (duplicates on purpose),
while this script SIGKILLs random workers — often inside a body — and restarts them.

    python examples/ledger/run.py --orders 300 --workers 3 --kills 8
    python examples/ledger/run.py --store postgresql+psycopg://postgres@127.0.0.1/test

Exits 0 when every order has exactly one ledger row; prints what happened.  The run works in
tables of its own (``ledger_<hex>_*``) and drops them when it ends: pointed at a database
that holds other idempotency records, it never touches them.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger import charge, drop_ledger, new_prefix, open_ledger, rows_per_order

from idempotent_tasks import ErrorCode, IdempotencyError


def work(url: str, prefix: str, orders: int, worker: int, seed: int) -> None:
    """A worker: deliver every charge in a random order until all are done."""
    _, handler, ledger = open_ledger(url, prefix)
    rng = random.Random(seed)
    pending = [f"o{i}" for i in range(orders)]
    while pending:
        rng.shuffle(pending)
        waiting = []
        for order_id in pending:
            try:
                charge(handler, ledger, order_id, 100, worker, hold=0.002)
            except IdempotencyError as exc:
                if exc.code not in (ErrorCode.REQUEST_IN_PROGRESS, ErrorCode.STORE_UNAVAILABLE):
                    raise
                waiting.append(order_id)  # another worker (or a dead one's lease) has it
        pending = waiting
        if pending:
            time.sleep(0.05)


def spawn(url: str, prefix: str, orders: int, worker: int, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--work", str(worker), "--store", url, "--prefix", prefix,
         "--orders", str(orders), "--seed", str(seed)],
        start_new_session=True,
    )


def fire(url: str, prefix: str, orders: int, workers: int, kills: int) -> tuple[int, float]:
    """Start the workers, kill ``kills`` of them at random moments, wait for the rest."""
    rng = random.Random(7)
    procs = {w: spawn(url, prefix, orders, w, rng.randrange(1 << 30)) for w in range(workers)}
    started, done_kills = time.monotonic(), 0
    try:
        while done_kills < kills:
            time.sleep(rng.uniform(0.05, 0.3))
            w = rng.randrange(workers)
            if procs[w].poll() is None:
                os.killpg(procs[w].pid, signal.SIGKILL)
                procs[w].wait()
                done_kills += 1
            procs[w] = spawn(url, prefix, orders, w + 100 * done_kills, rng.randrange(1 << 30))
        for p in procs.values():
            if p.wait(timeout=300) != 0:
                raise SystemExit(f"a worker failed with exit code {p.returncode}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return done_kills, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="SQL store URL (default: a temp SQLite file)")
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--work", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.work is not None:
        work(args.store, args.prefix, args.orders, args.work, args.seed)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'ledger.db'}"
        prefix = new_prefix()
        store, _, ledger = open_ledger(url, prefix)
        try:
            kills, duration = fire(url, prefix, args.orders, args.workers, args.kills)
            rows = rows_per_order(store, ledger)
        finally:
            drop_ledger(store, ledger)
        doubles = sum(1 for n in rows.values() if n > 1)
        lost = args.orders - len(rows)
        deliveries = "every worker delivers every charge"
        print(f"orders={args.orders} workers={args.workers} ({deliveries}) kills={kills} "
              f"rows={sum(rows.values())} doubles={doubles} lost={lost} "
              f"duration={duration:.1f}s")
        store.close()
        return 0 if doubles == 0 and lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
