"""The Celery / Dramatiq integration layer's own CPU per task, in instructions (callgrind).

``python -m benchmarks.integration_cpu [--n 100 400] [--baseline REF]``: runs
``_integration_cpu_probe.py`` under ``valgrind --tool=callgrind`` for every framework
(Celery, Dramatiq), mode (first delivery, replay) and variant (``layer``: the idempotent
task / actor; ``execute``: a plain one whose body calls ``handler.execute`` with the same
scope), with two values of ``N``; the difference of the totals over the difference of ``N``
is one task, and ``layer - execute`` is what the integration adds.  ``--baseline REF``
counts a git ref the same way (a temporary ``git worktree``, as ``cpu.py`` does).  Same
method as ``cpu.py``: ``PYTHONHASHSEED=0``, one plain run first for the bytecode caches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .cpu import ROOT, _env, callgrind_instructions, worktree

PROBE = Path(__file__).resolve().parent / "_integration_cpu_probe.py"
FRAMEWORKS = ("celery", "dramatiq")
MODES = ("first", "replay")
VARIANTS = ("layer", "execute")


def _count(tree: Path, framework: str, variant: str, mode: str, n: int) -> int:
    return callgrind_instructions(
        tree, [sys.executable, str(PROBE), framework, variant, mode, str(n)],
        f"{framework} {variant} {mode} n={n}", timeout=1800,
    )


def measure(tree: Path, ns: tuple[int, int]) -> dict[str, int]:
    """``{"celery first layer": instructions per task, ...}`` for one tree."""
    for framework in FRAMEWORKS:  # imports work, bytecode caches written
        subprocess.run([sys.executable, str(PROBE), framework, "layer", "first", "1", "1"],
                       cwd=tempfile.gettempdir(), env=_env(tree), capture_output=True,
                       check=True, timeout=300)
    runs = [(f, v, m, n) for f in FRAMEWORKS for m in MODES for v in VARIANTS for n in ns]
    with ThreadPoolExecutor(2) as pool:
        totals = dict(zip(runs, pool.map(lambda r: _count(tree, *r), runs), strict=True))
    small, large = ns
    return {
        f"{f} {m} {v}": round((totals[(f, v, m, large)] - totals[(f, v, m, small)])
                              / (large - small))
        for f in FRAMEWORKS for m in MODES for v in VARIANTS
    }


def table(ours: dict[str, int], baseline: dict[str, int] | None) -> str:
    head = "| framework | delivery | execute() task | idempotent task | layer |"
    if baseline is not None:
        head += " layer (baseline) |"
    lines = [head, "| --- | --- |" + " ---: |" * (head.count("|") - 3)]
    for f in FRAMEWORKS:
        for m in MODES:
            layer, plain = ours[f"{f} {m} layer"], ours[f"{f} {m} execute"]
            row = f"| {f} | {m} | {plain:,} | {layer:,} | {layer - plain:,} |"
            if baseline is not None:
                row += f" {baseline[f'{f} {m} layer'] - baseline[f'{f} {m} execute']:,} |"
            lines.append(row)
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.integration_cpu")
    parser.add_argument("--n", type=int, nargs=2, default=(100, 400))
    parser.add_argument("--baseline", default=None, help="a git ref to count as well")
    args = parser.parse_args(argv)
    ns = (args.n[0], args.n[1])
    out: dict[str, Any] = {"n": list(ns), "ours": measure(ROOT, ns)}
    if args.baseline is not None:
        with worktree(args.baseline) as tree:
            out["baseline"] = measure(tree, ns)
    print(json.dumps(out, indent=2))
    print(table(out["ours"], out.get("baseline")))


if __name__ == "__main__":
    main(sys.argv[1:])
