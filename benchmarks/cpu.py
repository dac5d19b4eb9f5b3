"""CPU per message, as instructions counted by callgrind (``--only cpu``).

Wall-clock microseconds drift by ±30 % on the shared machine; the number of instructions a
delivery executes does not (repeated runs agree to a few instructions per delivery).  The
probe (``_cpu_probe.py``) runs as a subprocess under ``valgrind --tool=callgrind
--callgrind-out-file=/dev/null``: ``IdempotencyHandler(MemoryStore(), metrics=...)``, a fixed
warm-up, then ``N`` first deliveries (a fresh key each) or ``N`` replays (one key that
already succeeded), all through ``handler.execute``.  It runs with two values of ``N``; the
difference of the two totals over the difference of ``N`` is the cost of one delivery (the
interpreter's start-up, the imports, building the handler and the warm-up are the same in
both runs and cancel out).  Each is measured with ``metrics=None`` and with the default
metrics (``"auto"``: Prometheus).

With a baseline (``--cpu-baseline REF``), the same probe also runs against a ``git worktree``
of ``REF`` checked out in a temporary directory (removed afterwards), imported through
``PYTHONPATH``; the probe uses only public API both versions have.  Every probe first runs
once without valgrind, so both trees' bytecode caches exist before anything is counted.
``PYTHONHASHSEED=0`` keeps dict layouts (and so the counts) the same from run to run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "_cpu_probe.py"
WARMUP = 200
MODES = {"first": "first delivery", "replay": "replay (store)"}
METRICS = {"none": "metrics=None", "auto": "Prometheus (default)"}
#: Probes run at the same time (instruction counts do not depend on it).
JOBS = max(1, min(2, os.cpu_count() or 1))
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")
_PACKAGE = re.compile(r"^package: (.+)$", re.MULTILINE)


def _env(tree: Path) -> dict[str, str]:
    """The tree to measure first on ``PYTHONPATH`` (ahead of the editable install)."""
    return dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree))


def _probe_args(mode: str, n: int, metrics: str, warmup: int = WARMUP) -> list[str]:
    return [sys.executable, str(PROBE), mode, str(n), metrics, str(warmup)]


def _check_package(stdout: str, tree: Path) -> None:
    """The probe must have imported the package of the tree it is meant to measure."""
    found = _PACKAGE.search(stdout)
    if found is None or not Path(found.group(1)).resolve().is_relative_to(tree.resolve()):
        where = found.group(1) if found else "nowhere"
        raise RuntimeError(f"cpu probe imported idempotent_tasks from {where}, not from {tree}")


def _prepare(tree: Path) -> None:
    """One plain run per metrics setting: imports work, bytecode caches get written."""
    for metrics in METRICS:
        done = subprocess.run(_probe_args("first", 1, metrics, warmup=1),
                              cwd=tempfile.gettempdir(), env=_env(tree), capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cpu probe failed on {tree}: {done.stderr[-1500:]}")
        _check_package(done.stdout, tree)


def _count(tree: Path, mode: str, metrics: str, n: int) -> int:
    """Instructions of one probe run under callgrind."""
    return callgrind_instructions(tree, _probe_args(mode, n, metrics),
                                  f"{mode} n={n} metrics={metrics}", timeout=900)


def callgrind_instructions(tree: Path, probe: list[str], what: str, *, timeout: float) -> int:
    """Instructions (Ir) of the ``probe`` command run under callgrind against ``tree``'s
    package (checked from the probe's ``package:`` line); ``what`` names it in errors."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *probe]
    done = subprocess.run(command, cwd=tempfile.gettempdir(), env=_env(tree),
                          capture_output=True, text=True, timeout=timeout, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind probe {what} failed (exit {done.returncode}): "
                           f"{done.stderr[-1500:]}")
    _check_package(done.stdout, tree)
    return int(found.group(1).replace(",", ""))


def measure(tree: Path, ns: tuple[int, int]) -> dict[str, Any]:
    """Instructions per delivery for every (mode, metrics) on one tree, with the raw totals."""
    _prepare(tree)
    small, large = ns
    runs = [(mode, metrics, n) for mode in MODES for metrics in METRICS for n in (small, large)]
    with ThreadPoolExecutor(JOBS) as pool:
        totals = list(pool.map(lambda r: _count(tree, *r), runs))
    by_run = dict(zip(runs, totals, strict=True))
    per: dict[str, Any] = {}
    for mode, mode_name in MODES.items():
        for metrics, metrics_name in METRICS.items():
            a, b = by_run[(mode, metrics, small)], by_run[(mode, metrics, large)]
            slope = (b - a) / (large - small)
            per[f"{mode_name}, {metrics_name}"] = {
                "instructions": round(slope),
                "fixed": round(a - slope * small),  # start-up, imports, warm-up
                "totals": {str(small): a, str(large): b},
            }
    return per


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``ref`` in a temporary directory, removed afterwards."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    if commit.returncode != 0:
        raise RuntimeError(f"--cpu-baseline {ref!r} is not a commit: {commit.stderr.strip()}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-cpu-baseline-"))
    path = tmp / "tree"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path),
                        commit.stdout.strip()], cwd=ROOT, check=True, capture_output=True)
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                       capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True, check=False)


def run(ns: tuple[int, int], baseline: str | None = None) -> dict[str, Any]:
    """``{"n": [..], "warmup": W, "ours": {measure: {...}}, "baseline": {...}, "ratio": ..}``."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    out: dict[str, Any] = {
        "method": "valgrind --tool=callgrind, instructions (Ir) of runs of n[1] and n[0] "
                  "deliveries after the same warm-up, difference / (n[1] - n[0])",
        "n": list(ns), "warmup": WARMUP, "ours": measure(ROOT, ns),
    }
    if baseline is not None:
        with worktree(baseline) as tree:
            out["baseline_ref"] = baseline
            out["baseline_commit"] = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                text=True, check=True,
            ).stdout.strip()
            out["baseline"] = measure(tree, ns)
        out["ratio"] = {
            name: round(row["instructions"] / out["baseline"][name]["instructions"], 3)
            for name, row in out["ours"].items()
        }
    return out


if __name__ == "__main__":  # pragma: no cover - manual use
    import json

    print(json.dumps(run((100, 300), sys.argv[1] if len(sys.argv) > 1 else None), indent=2))
