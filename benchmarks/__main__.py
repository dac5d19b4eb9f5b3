"""``python -m benchmarks [--quick] [--only core,peers,...] [--n N] [--json PATH]``.

Sections (default: all but ``scaling``, which takes longer and runs only when named):
core, peers, hotspots, e2e, consumers, batch, memory, cpu, asyncio, async_integrations
(FastStream and taskiq with and without the layer), scaleout (MariaDB and
DynamoDB against their own floors), outbox (staging cost, relay throughput and latency),
scaling.  ``cpu`` counts
instructions per delivery with callgrind; ``--cpu-baseline REF`` also counts them for a git
ref (checked out in a temporary worktree) and prints the ratio.  Every comparison is measured
in this one run, interleaved; ratios are the headline, absolute times secondary.  The
targets are checked from the same run and printed as PASS/FAIL.  JSON goes to
``benchmarks/results/latest.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from . import _services
from .async_integrations import table as async_integrations_table
from .async_integrations import targets as async_integrations_targets
from .asyncio_ import table as asyncio_table
from .asyncio_ import targets as asyncio_targets
from .outbox import table as outbox_table
from .outbox import targets as outbox_targets
from .report import PRINTERS, print_section, targets
from .scaleout import table as scaleout_table
from .scaleout import targets as scaleout_targets

PRINTERS["asyncio"] = asyncio_table
PRINTERS["async_integrations"] = async_integrations_table
PRINTERS["scaleout"] = scaleout_table
PRINTERS["outbox"] = outbox_table

SECTIONS = ["core", "peers", "hotspots", "e2e", "consumers", "batch", "memory", "cpu",
            "asyncio", "async_integrations", "scaleout", "outbox", "scaling"]
DEFAULT_SECTIONS = [s for s in SECTIONS if s != "scaling"]


@dataclass(frozen=True)
class Params:
    n: int
    e2e_n: int
    e2e_rounds: int
    consumers_n: int
    batch_scopes: int
    batch_rounds: int
    memory_sizes: dict[str, int]
    scaling_sizes: list[int]
    scaling_ops: int
    concurrency_s: float
    cleanup_n: int
    #: The two numbers of deliveries the cpu section's probe runs (their difference counts).
    cpu_ns: tuple[int, int]
    #: asyncio: operations per contender; HTTP load clients, seconds per run, rounds.
    async_n: int = 2000
    http_clients: int = 200
    http_seconds: float = 10.0
    http_rounds: int = 2
    #: async_integrations: messages per run (FastStream, taskiq; with and without the layer)
    #: and rounds (each round: floor, engine, every integration plain and layered).
    async_messages: int = 500
    async_rounds: int = 11
    #: outbox: staging ops, rows the relay drains per broker, messages timed for latency.
    outbox_n: int = 3000
    outbox_relay_n: int = 20_000
    outbox_latency_n: int = 500


QUICK = Params(
    n=300, e2e_n=300, e2e_rounds=3, consumers_n=300, batch_scopes=2000, batch_rounds=3,
    memory_sizes={"memory": 10_000, "sqlite": 10_000, "postgresql": 10_000, "redis": 10_000,
                  "redis (hash-max-listpack-value 256)": 10_000},
    scaling_sizes=[10_000, 100_000], scaling_ops=200, concurrency_s=1.0, cleanup_n=10_000,
    cpu_ns=(100, 300), async_n=300, http_clients=200, http_seconds=3.0, http_rounds=1,
    async_messages=300, async_rounds=3, outbox_n=300, outbox_relay_n=3000, outbox_latency_n=100,
)
FULL = Params(
    n=2000, e2e_n=2000, e2e_rounds=5, consumers_n=2000, batch_scopes=20_000, batch_rounds=5,
    memory_sizes={"memory": 100_000, "sqlite": 200_000, "postgresql": 1_000_000,
                  "redis": 1_000_000, "redis (hash-max-listpack-value 256)": 1_000_000},
    scaling_sizes=[10_000, 100_000, 1_000_000], scaling_ops=1000, concurrency_s=3.0,
    cleanup_n=100_000, cpu_ns=(500, 1500), async_n=2000, http_clients=200, http_seconds=10.0,
    http_rounds=2,
)


def _section_runners(
    p: Params, stores: list[str], cpu_baseline: str | None = None
) -> dict[str, Callable[[], Any]]:
    from . import (
        async_integrations,
        asyncio_,
        batch,
        consumers,
        core,
        cpu,
        e2e,
        hotspots,
        memory,
        outbox,
        peers,
        scaleout,
        scaling,
    )

    networked = [s for s in stores if s in ("postgresql", "redis")]
    return {
        "core": lambda: core.run(stores, p.n),
        "peers": lambda: peers.run(p.n),
        "hotspots": lambda: hotspots.run(p.n),
        "e2e": lambda: e2e.run(p.e2e_n, p.e2e_rounds, networked),
        "consumers": lambda: consumers.run(p.consumers_n),
        "batch": lambda: batch.run(p.batch_scopes, p.batch_rounds,
                                   [s for s in stores if s != "memory"]),
        "memory": lambda: memory.run(p.memory_sizes),
        "cpu": lambda: cpu.run(p.cpu_ns, cpu_baseline),
        "scaleout": lambda: scaleout.run(p.n, p.batch_scopes, p.batch_rounds),
        "outbox": lambda: outbox.run(p.outbox_n, p.outbox_relay_n, p.outbox_latency_n),
        "asyncio": lambda: asyncio_.run(p.async_n, p.http_clients, p.http_seconds,
                                        p.http_rounds),
        "async_integrations": lambda: async_integrations.run(p.async_messages,
                                                             p.async_rounds),
        "scaling": lambda: scaling.run(p.scaling_sizes, p.scaling_ops, p.concurrency_s,
                                       p.cleanup_n, [s for s in stores if s != "memory"]),
    }


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "idempotent_tasks"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in idempotent_tasks/" if dirty else "")


def _header(args: argparse.Namespace, sections: list[str]) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(args.argv),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "git": _git(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "mode": "quick" if args.quick else "full",
        "sections": sections,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small n: a smoke run (~2 min)")
    parser.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                        help=f"comma-separated sections among {','.join(SECTIONS)}")
    parser.add_argument("--n", type=int, default=None, help="operations per contender (core, "
                        "peers, hotspots)")
    parser.add_argument("--stores", default="memory,sqlite,postgresql,redis")
    parser.add_argument("--scaling-max", type=int, default=None,
                        help="largest PostgreSQL table in the scaling section (e.g. 10000000)")
    parser.add_argument("--cpu-baseline", metavar="REF", default=None,
                        help="cpu section: also count a git ref (e.g. a7d21ef), checked out "
                        "in a temporary worktree, and print before/after")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/latest.json"))
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else os.sys.argv[1:]
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return args


def _params(args: argparse.Namespace) -> Params:
    p = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.n is not None:
        changes["n"] = args.n
    if args.scaling_max is not None:
        sizes = [s for s in (10_000, 100_000, 1_000_000, 10_000_000) if s <= args.scaling_max]
        changes["scaling_sizes"] = sizes
    return Params(**{**p.__dict__, **changes})


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=120)
    sections = [s for s in SECTIONS if s in args.only.split(",")]
    stores = [s for s in args.stores.split(",") if s]
    report: dict[str, Any] = _header(args, sections)
    console.print(f"[bold]{report['command']}[/] — {report['date']} — {report['machine']}, "
                  f"Python {report['python']}, git {report['git']}, "
                  f"load {report['load_average_at_start']}")
    runners = _section_runners(_params(args), stores, args.cpu_baseline)
    for name in sections:
        started = time.perf_counter()
        try:
            report[name] = _services.retry_once(name, runners[name])
        except Exception as exc:  # one failed section must not hide the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            _services.NOISE.append(f"{name}: failed: {report[name]['error']}")
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        print_section(name, report[name], report, console)
    rows = (targets(report) + asyncio_targets(report) + async_integrations_targets(report)
            + scaleout_targets(report) + outbox_targets(report))
    report["targets"] = [t for t in rows if t["result"] != "NOT RUN"]
    if report["targets"]:
        print_section("targets", report["targets"], report, console)
    _services.drop_leftovers()
    report["noise"] = list(_services.NOISE)
    for line in report["noise"]:
        console.print(f"[yellow]note:[/] {line}")
    if _services.LEFTOVERS:
        console.print(f"[red]could not drop:[/] {_services.LEFTOVERS}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    console.print(f"JSON written to {args.json}; sections took {report['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
