"""``python -m benchmarks [--n N] [--stores a,b] [--json PATH]``: figures and ratios."""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .core import measure_floor, measure_store

STORES = ["memory", "sqlite", "postgresql", "redis"]


def _ratio(value: float | None, floor: float | None) -> str:
    if value is None or not floor:
        return "-"
    return f"{value / floor:.2f}x"


def run_core(stores: list[str], n: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in stores:
        floor = measure_floor(kind, n)
        ours = measure_store(kind, n)
        results[kind] = {"floor": floor, "ours": ours}
    return results


def print_core(results: dict[str, Any], console: Console) -> None:
    table = Table(title="execute() per message, µs (median of 5 batches); ratio to the raw floor")
    for col in ("store", "measure", "ours µs", "floor µs", "ratio"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for kind, r in results.items():
        floor, ours = r["floor"], r["ours"]
        pairs = {
            "first delivery": floor.get("claim+complete"),
            "replay (store)": floor.get("claim-or-get"),
            "replay (local cache)": None,
            "in-progress rejection": floor.get("claim-or-get"),
        }
        for measure, value in ours.items():
            f = pairs.get(measure)
            table.add_row(
                kind, measure, f"{value:.1f}", "-" if f is None else f"{f:.1f}", _ratio(value, f)
            )
    console.print(table)


def run_peers(n: int) -> dict[str, Any]:
    from . import peers

    out: dict[str, Any] = {}
    for name, fn in (
        ("powertools (redis)", peers.powertools),
        ("celery-once (redis)", peers.celery_once),
    ):
        try:
            out[name] = fn(n)
        except ImportError as exc:
            out[name] = {"error": f"not installed ({exc.name}); pip install -e '.[bench]'"}
    return out


def print_peers(peer: dict[str, Any], core: dict[str, Any], console: Console) -> None:
    ours = core.get("redis", {}).get("ours", {})
    table = Table(title="Peers on the same Redis, µs per call; ratio = ours / peer (< 1 is faster)")
    for col in ("peer", "measure", "peer µs", "ours µs (redis)", "ratio"):
        table.add_column(col, justify="left" if col in ("peer", "measure") else "right")
    mapping = {
        "first delivery": "first delivery",
        "replay": "replay (store)",
        "replay (local cache)": "replay (local cache)",
        "lock (first delivery)": "first delivery",
    }
    for name, rows in peer.items():
        if "error" in rows:
            table.add_row(name, rows["error"], "-", "-", "-")
            continue
        for measure, value in rows.items():
            mine = ours.get(mapping.get(measure, ""))
            table.add_row(
                name, measure, f"{value:.1f}", "-" if mine is None else f"{mine:.1f}",
                _ratio(mine, value),
            )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--n", type=int, default=2000, help="operations per batch")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/latest.json"))
    parser.add_argument("--no-peers", action="store_true", help="skip Powertools / celery-once")
    args = parser.parse_args(argv)
    console = Console()
    started = time.time()
    core = run_core([s for s in args.stores.split(",") if s], args.n)
    print_core(core, console)
    peer = {} if args.no_peers else run_peers(args.n)
    if peer:
        print_peers(peer, core, console)
    report = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "started": started,
        "n": args.n,
        "core": core,
        "peers": peer,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
