"""The demo: every guarantee of the library, shown on a real store, in well under a minute.

It runs three sections on one store — the core handler's scenarios
(:mod:`.core_scenario`), then Celery's and Dramatiq's (``celery_scenario`` /
``dramatiq_scenario``: real workers on in-process brokers), each returning
:class:`~idempotent_tasks.demo._report.ScenarioLine` rows — and prints what ran once, what was
replayed, what was poisoned and what was recovered, the metrics the run produced and the
store's counts.  The exit status is the verdict: 1 when any row did not behave as guaranteed.

The default store is a SQLite file in a fresh temporary directory, so nothing but Python is
needed; ``--store postgresql+psycopg://…`` runs the same on a real server.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from ..stores.urls import redact_url, store_from_url, url_scheme
from ._report import ScenarioLine

Runner = Callable[[str, Path], Iterable[ScenarioLine]]
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[SampleKey, float]

#: (section, module, pip extra naming the framework)
INTEGRATIONS = (
    ("celery", "idempotent_tasks.demo.celery_scenario", "celery"),
    ("dramatiq", "idempotent_tasks.demo.dramatiq_scenario", "dramatiq"),
)


@dataclass
class DemoReport:
    """Everything the demo learned, in the order it is printed."""

    store_url: str
    lines: list[ScenarioLine] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    core_metrics: Samples = field(default_factory=dict)
    integration_metrics: Samples = field(default_factory=dict)
    stats: Mapping[tuple[str, Any], int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[ScenarioLine]:
        return [line for line in self.lines if not line.ok]

    @property
    def ok(self) -> bool:
        return bool(self.lines) and not self.failed


# ----------------------------------------------------------------------------- metrics
def metric_samples(registry: Any) -> Samples:
    """The ``idempotency_*`` samples of a prometheus registry (no buckets, no ``_created``)."""
    out: Samples = {}
    for metric in registry.collect():
        for sample in metric.samples:
            name = sample.name
            if not name.startswith("idempotency_") or name.endswith(("_created", "_bucket")):
                continue
            out[(name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def delta(after: Samples, before: Samples) -> Samples:
    """What changed between two snapshots (zero changes dropped)."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value for (n, lab), value in samples.items()
        if n == name and all(dict(lab).get(k) == v for k, v in labels.items())
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


def run_section(name: str, runner: Runner, store_url: str, workdir: Path) -> list[ScenarioLine]:
    """Run one section; an exception becomes a failed row instead of ending the demo."""
    try:
        lines = list(runner(store_url, workdir))
    except Exception as exc:
        return [ScenarioLine(name, "section crashed", 0, 0, f"{type(exc).__name__}: {exc}", False)]
    if not lines:
        return [ScenarioLine(name, "section ran", 0, 0, "reported no scenario", False)]
    return lines


def _integrations(report: DemoReport, workdir: Path, console: Console) -> None:
    from prometheus_client import REGISTRY

    before = metric_samples(REGISTRY)
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
            report.lines.extend(run_section(name, runner, report.store_url, section_dir))
    report.integration_metrics = delta(metric_samples(REGISTRY), before)


def collect(store_url: str, workdir: Path, console: Console) -> DemoReport:
    """Run every section on ``store_url`` and gather lines, metrics and store counts."""
    from prometheus_client import CollectorRegistry

    from .core_scenario import run_scenario as run_core

    started = time.perf_counter()
    report = DemoReport(store_url)
    registry = CollectorRegistry()
    with console.status("running the core handler scenarios…"):
        report.lines.extend(
            run_section("core", lambda u, w: run_core(u, w, registry=registry), store_url,
                        workdir)
        )
    report.core_metrics = metric_samples(registry)
    _integrations(report, workdir, console)
    store = store_from_url(store_url)
    try:
        report.stats = dict(store.stats())
    finally:
        store.close()
    report.seconds = time.perf_counter() - started
    return report


# ----------------------------------------------------------------------------- printing
def _lines_table(report: DemoReport) -> Table:
    table = Table(title="What happened", title_justify="left")
    for name, justify in (("integration", "left"), ("scenario", "left"),
                          ("deliveries", "right"), ("body ran", "right"),
                          ("what the library did", "left"), ("ok", "center")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for line in report.lines:
        table.add_row(
            escape(line.integration), escape(line.scenario), str(line.deliveries),
            str(line.executions), escape(line.outcome),
            "[green]yes[/]" if line.ok else "[bold red]NO[/]",
        )
    return table


def _summary(report: DemoReport) -> Panel:
    both = dict(report.core_metrics)
    for k, v in report.integration_metrics.items():
        both[k] = both.get(k, 0.0) + v
    executed = total(both, "idempotency_executions_total", outcome="success")
    rows = [
        ("bodies run to success", executed),
        ("replayed (duplicate of a SUCCESS)",
         total(both, "idempotency_duplicates_total", status="SUCCESS")),
        ("duplicates of PROCESSING (409 or takeover)",
         total(both, "idempotency_duplicates_total", status="PROCESSING")),
        ("refused as poisoned", total(both, "idempotency_duplicates_total", status="FAILED")),
        ("poisoned", total(both, "idempotency_poisoned_total")),
        ("transient failures counted",
         total(both, "idempotency_executions_total", outcome="transient_failure")),
        ("recovered by maintenance", total(both, "idempotency_recovered_total")),
        ("expired records purged", total(both, "idempotency_cleaned_total")),
        ("stale owners refused (lease lost)", total(both, "idempotency_lease_lost_total")),
    ]
    text = "\n".join(f"{label:<44} {value:>6.0f}" for label, value in rows)
    source = "core + in-process integrations" if report.integration_metrics else (
        "core section; framework workers count in their own processes"
    )
    return Panel(text, title=f"Totals from the metrics ({source})", expand=False)


def _metrics_table(report: DemoReport) -> Table:
    """Counters the run produced.  Framework workers that run in their own processes record
    in their own registries; the integrations column appears when any was in this one."""
    integrations = bool(report.integration_metrics)
    table = Table(title="Metrics (core: a private CollectorRegistry)", title_justify="left")
    columns = [("metric", "left"), ("labels", "left"), ("core", "right")]
    if integrations:
        columns.append(("integrations (this process)", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    keys = sorted(set(report.core_metrics) | set(report.integration_metrics))
    for name, labels in keys:
        if name.startswith("idempotency_store_seconds"):
            continue
        values = [report.core_metrics.get((name, labels), 0.0)]
        if integrations:
            values.append(report.integration_metrics.get((name, labels), 0.0))
        if any(values):
            shown = escape(", ".join(f"{k}={v}" for k, v in labels))
            table.add_row(name, shown, *(f"{v:g}" for v in values))
    calls = total(report.core_metrics, "idempotency_store_seconds_count")
    spent = total(report.core_metrics, "idempotency_store_seconds_sum")
    if calls:
        table.add_row("idempotency_store_seconds", "all calls",
                      f"{calls:g} calls, mean {spent / calls * 1000:.2f} ms",
                      *([""] if integrations else []))
    return table


def _stats_table(report: DemoReport) -> Table:
    table = Table(title="Store stats (records by operation and status)", title_justify="left")
    statuses = ("PROCESSING", "SUCCESS", "FAILED")
    table.add_column("operation")
    for status in statuses:
        table.add_column(status, justify="right")
    per_op: dict[str, dict[str, int]] = {}
    for (operation, status), n in sorted(report.stats.items(), key=lambda kv: str(kv[0])):
        per_op.setdefault(operation, dict.fromkeys(statuses, 0))[str(status)] += n
    for operation, row in per_op.items():
        table.add_row(escape(operation), *(str(row[s]) for s in statuses))
    return table


def print_report(console: Console, report: DemoReport) -> None:
    console.print(_lines_table(report))
    for name, why in report.skipped:
        console.print(f"[yellow]skipped[/] {escape(name)}: {escape(why)}")
    console.print(_summary(report))
    console.print(_metrics_table(report))
    console.print(_stats_table(report))
    n = len(report.lines)
    if report.ok:
        console.print(
            f"[bold green]demo OK[/]: all {n} scenarios behaved as guaranteed "
            f"({report.seconds:.1f}s)"
        )
    else:
        names = escape("; ".join(f"{ln.integration}/{ln.scenario}" for ln in report.failed))
        console.print(
            f"[bold red]demo FAILED[/]: {len(report.failed)} of {n} scenarios did not behave "
            f"as guaranteed: {names}"
        )


# ----------------------------------------------------------------------------- entry points
def _memory_shared(url: str) -> str:
    """``memory://`` alone would give every section its own empty store: name it."""
    if url_scheme(url) == "memory" and not url.partition("://")[2].strip("/"):
        return f"memory://demo-{uuid.uuid4().hex[:8]}"
    return url


def run_demo(store_url: str | None = None, *, keep: bool = False,
             console: Console | None = None) -> int:
    """Run the demo and print its report; returns the exit code (0: all as guaranteed, 1:
    not).  ``idempotent-tasks demo`` passes the CLI's console."""
    console = console or Console(highlight=False)
    workdir = Path(tempfile.mkdtemp(prefix="idempotent-tasks-demo-"))
    url = _memory_shared(store_url) if store_url else f"sqlite:///{workdir / 'demo.db'}"
    console.print(Panel.fit(
        escape(f"store: {redact_url(url)}\nworkdir: {workdir}"),
        title="idempotent-tasks demo: duplicate, concurrent, failing and crashing deliveries",
    ))
    try:
        report = collect(url, workdir, console)
        print_report(console, report)
    finally:
        if keep:
            console.print(escape(f"kept {workdir}"))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if report.ok else 1
