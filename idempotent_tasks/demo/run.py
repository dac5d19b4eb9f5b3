"""The demo: every guarantee of the library, shown on a real store, in well under a minute.

It runs three sections on one store — the core handler's scenarios
(:mod:`.core_scenario`), then Celery's and Dramatiq's (``celery_scenario`` /
``dramatiq_scenario``: real workers on in-process brokers), each returning
:class:`~idempotent_tasks.demo._report.ScenarioLine` rows — and prints what ran once, what was
replayed, what was poisoned and what was recovered, totals from the metrics every section
recorded, and the store's counts (:mod:`._print`).  The exit status is the verdict: 1 when
any row did not behave as guaranteed, or when the metrics disagree with the rows.

The default store is a SQLite file in a fresh temporary directory, so nothing but Python is
needed; ``--store postgresql+psycopg://…`` runs the same on a real server.  A framework that
is not installed is skipped with the ``pip install`` that adds it; without prometheus-client
the totals are left out (with its install hint) and everything else runs.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from .._core.metrics import Metrics
from ..stores.urls import redact_url, store_from_url, url_scheme
from ._print import DemoReport, metric_samples, print_report
from ._report import ScenarioLine

#: ``run_scenario(store_url, workdir, *, metrics=..., prefix=...)`` of a section.
Runner = Callable[..., Iterable[ScenarioLine]]

#: (section, module, pip extra naming the framework)
INTEGRATIONS = (
    ("celery", "idempotent_tasks.demo.celery_scenario", "celery"),
    ("dramatiq", "idempotent_tasks.demo.dramatiq_scenario", "dramatiq"),
)

METRICS_HINT = "prometheus-client is not installed: pip install 'idempotent-tasks[prometheus]'"
TITLE = "idempotent-tasks demo"
SUBTITLE = (
    "duplicate, concurrent, failing and crashing deliveries through the core handler, "
    "Celery and Dramatiq"
)


# ----------------------------------------------------------------------------- sections
def load_runner(module_name: str, extra: str) -> tuple[Runner | None, str | None]:
    """The section's ``run_scenario``, or why it cannot run (skipped, not failed, when the
    module or its framework is not installed)."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None, "its scenario module is not part of this installation"
        return None, f"{exc.name} is not installed: pip install 'idempotent-tasks[{extra}]'"
    runner = getattr(module, "run_scenario", None)
    if not callable(runner):
        raise ImportError(f"{module_name} has no run_scenario(store_url, workdir)")
    return runner, None


def run_section(
    name: str, runner: Runner, store_url: str, workdir: Path, **options: Any
) -> list[ScenarioLine]:
    """Run one section; an exception becomes a failed row instead of ending the demo."""
    try:
        lines = list(runner(store_url, workdir, **options))
    except Exception as exc:
        return [ScenarioLine(name, "section crashed", 0, 0, f"{type(exc).__name__}: {exc}", False)]
    if not lines:
        return [ScenarioLine(name, "section ran", 0, 0, "reported no scenario", False)]
    return lines


def demo_metrics() -> tuple[Metrics | None, Any]:
    """One Prometheus registry of the demo's own, shared by every section (so the totals
    cover them all and nothing lands in the process's default registry), or ``(None,
    None)`` when prometheus-client is not installed."""
    try:
        from prometheus_client import CollectorRegistry
    except ModuleNotFoundError:
        return None, None
    from .._core.metrics import PrometheusMetrics

    registry = CollectorRegistry()
    return PrometheusMetrics(registry), registry


def _integrations(
    report: DemoReport, workdir: Path, console: Console, options: dict[str, Any]
) -> None:
    in_process_only = url_scheme(report.store_url) == "memory"
    for name, module_name, extra in INTEGRATIONS:
        if in_process_only:
            report.skipped.append((name, "its workers need a store they can share (sqlite://, "
                                         "postgresql://, redis://); memory:// is this process's"))
            continue
        try:
            runner, why = load_runner(module_name, extra)
        except ImportError as exc:
            report.lines.append(ScenarioLine(name, "section", 0, 0, str(exc), False))
            continue
        if runner is None:
            report.skipped.append((name, why or "unavailable"))
            continue
        section_dir = workdir / name
        section_dir.mkdir(exist_ok=True)
        with console.status(f"running the {name} scenarios (real workers)…"):
            report.lines.extend(run_section(name, runner, report.store_url, section_dir,
                                            **options))


def collect(
    store_url: str, workdir: Path, console: Console, *, prefix: str | None = None
) -> DemoReport:
    """Run every section on ``store_url`` (under ``prefix``) and gather lines, metrics and
    store counts."""
    from .core_scenario import run_scenario as run_core

    started = time.perf_counter()
    report = DemoReport(store_url)
    metrics, registry = demo_metrics()
    if metrics is None:
        report.metrics_missing = METRICS_HINT
    options: dict[str, Any] = {"metrics": metrics, "prefix": prefix}
    with console.status("running the core handler scenarios…"):
        report.lines.extend(run_section("core", run_core, store_url, workdir, **options))
    _integrations(report, workdir, console, options)
    if registry is not None:
        report.metrics = metric_samples(registry)
    store = store_from_url(store_url, prefix=prefix)
    try:
        report.stats = dict(store.stats())
    finally:
        store.close()
    report.seconds = time.perf_counter() - started
    return report


# ----------------------------------------------------------------------------- entry points
def _memory_shared(url: str) -> str:
    """``memory://`` alone would give every section its own empty store: name it."""
    if url_scheme(url) == "memory" and not url.partition("://")[2].strip("/"):
        return f"memory://demo-{uuid.uuid4().hex[:8]}"
    return url


def run_demo(store_url: str | None = None, *, prefix: str | None = None, keep: bool = False,
             console: Console | None = None) -> int:
    """Run the demo and print its report; returns the exit code (0: all as guaranteed, 1:
    not).  ``prefix``: the store's table / key prefix (the store's default when ``None``).
    ``idempotent-tasks demo`` passes the CLI's console."""
    console = console or Console(highlight=False)
    workdir = Path(tempfile.mkdtemp(prefix="idempotent-tasks-demo-"))
    url = _memory_shared(store_url) if store_url else f"sqlite:///{workdir / 'demo.db'}"
    where = f"store: {redact_url(url)}" + (f" (prefix {prefix})" if prefix else "")
    console.print(Panel.fit(escape(f"{SUBTITLE}\n{where}\nworkdir: {workdir}"), title=TITLE))
    try:
        report = collect(url, workdir, console, prefix=prefix)
        print_report(console, report)
    finally:
        if keep:
            console.print(escape(f"kept {workdir}"))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.ok else 1
