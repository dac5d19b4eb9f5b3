"""How the demo's report reads: built to fit an 80-column terminal.

Each scenario is one row whose first line names it and whose second line (wrapped only on
narrow terminals) says what the library did; the totals come from the metrics that every
section recorded in one registry, next to the metric each figure is read from, and are
checked against the rows: the bodies the metrics counted must be the bodies the rows saw
run, or the demo fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ._report import ScenarioLine

SampleKey = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[SampleKey, float]
Term = tuple[str, Mapping[str, str]]

#: How each section is introduced in the table.
SECTION_TITLES = {
    "core": "core handler (threads in this process)",
    "celery": "Celery (a real worker, in-memory broker)",
    "dramatiq": "Dramatiq (a real worker, stub broker)",
}

METRIC_PREFIX = "idempotency_"
EXECUTIONS = METRIC_PREFIX + "executions_total"
LEASE_LOST = METRIC_PREFIX + "lease_lost_total"
DUPLICATES = METRIC_PREFIX + "duplicates_total"

#: The bodies that ran, as the metrics count them: every execution by outcome, plus the
#: stale owners whose late result was refused.
BODIES_RUN: tuple[Term, ...] = ((EXECUTIONS, {}), (LEASE_LOST, {}))

#: (label, the metric terms summed for it), in the order printed.
TOTALS: tuple[tuple[str, tuple[Term, ...]], ...] = (
    ("bodies run", BODIES_RUN),
    ("  ran to success", ((EXECUTIONS, {"outcome": "success"}),)),
    ("  failed permanently", ((EXECUTIONS, {"outcome": "permanent_failure"}),)),
    ("  failed transiently", ((EXECUTIONS, {"outcome": "transient_failure"}),)),
    ("  outlived its lease", ((LEASE_LOST, {}),)),
    ("replayed a stored result", ((DUPLICATES, {"status": "SUCCESS"}),)),
    ("found it still running", ((DUPLICATES, {"status": "PROCESSING"}),)),
    ("refused as poisoned", ((DUPLICATES, {"status": "FAILED"}),)),
    ("scopes poisoned", (("idempotency_poisoned_total", {}),)),
    ("crashed attempts recovered", (("idempotency_recovered_total", {}),)),
    ("expired records purged", (("idempotency_cleaned_total", {}),)),
)


@dataclass
class DemoReport:
    """Everything the demo learned, in the order it is printed."""

    store_url: str
    lines: list[ScenarioLine] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Every section's samples, from the demo's one registry (empty without prometheus).
    metrics: Samples = field(default_factory=dict)
    #: Why there are no metrics (prometheus-client missing), else ``None``.
    metrics_missing: str | None = None
    stats: Mapping[tuple[str, Any], int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[ScenarioLine]:
        return [line for line in self.lines if not line.ok]

    @property
    def bodies_ran(self) -> int:
        """The rows' "ran" column, added up."""
        return sum(line.executions for line in self.lines)

    @property
    def metrics_disagree(self) -> str | None:
        """Why the metrics do not add up to the rows, or ``None`` when they do (or when
        there are no metrics to compare)."""
        if self.metrics_missing is not None:
            return None
        counted = terms_total(self.metrics, BODIES_RUN)
        if counted == self.bodies_ran:
            return None
        return (f"the metrics counted {counted:.0f} bodies run, the rows "
                f"{self.bodies_ran}")

    @property
    def ok(self) -> bool:
        return bool(self.lines) and not self.failed and self.metrics_disagree is None


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


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value for (n, lab), value in samples.items()
        if n == name and all(dict(lab).get(k) == v for k, v in labels.items())
    )


def terms_total(samples: Samples, terms: tuple[Term, ...]) -> float:
    return sum(total(samples, name, **labels) for name, labels in terms)


def _term_text(terms: tuple[Term, ...]) -> str:
    def one(name: str, labels: Mapping[str, str]) -> str:
        short = name.removeprefix(METRIC_PREFIX)
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{short}{{{inner}}}" if inner else short

    return " + ".join(one(name, labels) for name, labels in terms)


# ----------------------------------------------------------------------------- tables
def lines_table(report: DemoReport) -> Table:
    table = Table(title="What happened", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    table.add_column("scenario, and what the library did", ratio=1, overflow="fold")
    for name in ("sent", "ran", "ok"):
        table.add_column(name, justify="right" if name != "ok" else "center", no_wrap=True)
    section = None
    for line in report.lines:
        if line.integration != section:
            if section is not None:
                table.add_section()
            section = line.integration
            title = SECTION_TITLES.get(section, section)
            table.add_row(f"[bold]{escape(title)}[/]", "", "", "")
        table.add_row(
            Group(Text(line.scenario), Padding(Text(line.outcome, style="dim"), (0, 0, 0, 2))),
            str(line.deliveries), str(line.executions),
            "[green]yes[/]" if line.ok else "[bold red]NO[/]",
        )
    return table


def totals_table(report: DemoReport) -> Table:
    """The totals, each next to the metric it is read from."""
    sections = list(dict.fromkeys(line.integration for line in report.lines))
    table = Table(title=f"Totals of all {len(report.lines)} scenarios ({', '.join(sections)}), "
                        "from the metrics", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    table.add_column("")
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column(f"metric ({METRIC_PREFIX}…)", style="dim", no_wrap=True)
    sent = sum(line.deliveries for line in report.lines)
    table.add_row("deliveries sent", str(sent), "")
    for label, terms in TOTALS:
        value = terms_total(report.metrics, terms)
        table.add_row(escape(label), f"{value:.0f}", escape(_term_text(terms)))
    calls = total(report.metrics, "idempotency_store_seconds_count")
    spent = total(report.metrics, "idempotency_store_seconds_sum")
    if calls:
        table.add_row("store calls", f"{calls:.0f}",
                      f"store_seconds_count (mean {spent / calls * 1000:.2f} ms)")
    return table


def stats_table(report: DemoReport) -> Table:
    table = Table(title="Store stats (records by operation and status)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
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


def _verdict(console: Console, report: DemoReport) -> None:
    n = len(report.lines)
    disagree = report.metrics_disagree
    if report.ok:
        console.print(
            f"[bold green]demo OK[/]: all {n} scenarios behaved as guaranteed "
            f"({report.seconds:.1f}s)"
        )
        return
    reasons = [f"{ln.integration}/{ln.scenario}" for ln in report.failed]
    if disagree:
        reasons.append(disagree)
    console.print(
        f"[bold red]demo FAILED[/]: {len(report.failed)} of {n} scenarios did not behave "
        f"as guaranteed: {escape('; '.join(reasons))}"
    )


def print_report(console: Console, report: DemoReport) -> None:
    console.print(lines_table(report))
    for name, why in report.skipped:
        console.print(f"[yellow]skipped[/] {escape(name)}: {escape(why)}")
    console.print()
    if report.metrics_missing is None:
        console.print(totals_table(report))
        if report.metrics_disagree is None:
            console.print(f"[dim]The metrics count {report.bodies_ran} bodies run: the "
                          "total of the \"ran\" column.[/]")
    else:
        console.print(f"[yellow]totals not shown[/]: {escape(report.metrics_missing)}")
    console.print()
    console.print(stats_table(report))
    _verdict(console, report)
