"""Printing the sections as tables, and checking the targets from the same run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i < 2 else "right")
    return table


def _num(value: Any, digits: int = 1) -> str:
    if isinstance(value, int | float):
        return f"{value:,.{digits}f}"
    return "-" if value is None else str(value)


def _ratio(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, int | float) else "-"


# --------------------------------------------------------------------------- sections
def core_table(data: dict[str, Any], console: Console) -> None:
    t = _table("execute() per message, µs (interleaved batches of 25, medians); "
               "ratio = median of paired batch ratios ours/floor; minimal = the bare-table / "
               "plain-client floor (floors.floor_ops, minimal=True)",
               ["store", "measure", "ours µs", "floor µs", "floor", "ratio", "minimal µs",
                "ratio vs minimal"])
    for kind, rows in data.items():
        for measure, row in rows.items():
            t.add_row(kind, measure, _num(row["ours"]), _num(row.get("floor")),
                      row.get("floor_name", "-"), _ratio(row.get("ratio")),
                      _num(row.get("minimal")), _ratio(row.get("ratio_minimal")))
    console.print(t)


def peers_table(data: dict[str, Any], console: Console) -> None:
    t = _table("Peers on the same Redis, interleaved with our execute() on RedisStore; "
               "ratio = ours/peer (< 1: we are faster)",
               ["peer", "measure", "peer µs", "ours µs", "ratio"])
    for peer, rows in data.items():
        if "error" in rows:
            t.add_row(peer, escape(rows["error"]), "-", "-", "-")  # "[bench]" is not markup
            continue
        for measure, row in rows.items():
            t.add_row(peer, measure, _num(row["peer"]), _num(row["ours"]), _ratio(row["ratio"]))
    console.print(t)


def hotspots_table(data: dict[str, Any], console: Console) -> None:
    t = _table("Where the time goes (interleaved); ratio to the first row of each probe",
               ["probe", "contender", "µs", "ratio"])
    for probe, rows in data.items():
        for name, row in rows.items():
            t.add_row(probe, name, _num(row["us"]), _ratio(row["ratio"]))
    console.print(t)


def e2e_table(data: dict[str, Any], console: Console) -> None:
    t = _table(f"End-to-end through RabbitMQ, {data['n']} pre-published trivial tasks, medians "
               f"of {data['rounds']} alternating rounds; cost = 1/thr_with - 1/thr_without",
               ["framework", "variant", "tasks/s", "cost µs/task", "floor in a loop µs",
                "cost/floor", "cost/floor vs acks_late", "floor in the worker µs",
                "cost/worker floor"])
    for fw in ("celery", "dramatiq"):
        for variant, row in data.get(fw, {}).items():
            t.add_row(fw, variant, _num(row["median"]), _num(row.get("cost_us")),
                      _num(row.get("floor_us")), _ratio(row.get("ratio_to_floor")),
                      _ratio(row.get("ratio_to_floor_vs_acks_late")),
                      _num(row.get("worker_floor_us")), _ratio(row.get("ratio_to_worker_floor")))
    console.print(t)
    console.print("runs per variant: " + "; ".join(
        f"{fw}/{v}: {row['rates']}" for fw in ("celery", "dramatiq")
        for v, row in data.get(fw, {}).items()))
    console.print(f"poll-loop stalls (> 50 ms gaps) left out of drain times: "
                  f"{data.get('stalls_excluded', 0)}")


def consumers_table(data: dict[str, Any], console: Console) -> None:
    from .consumers import render

    console.print(render(data))


def batch_table(data: dict[str, Any], console: Console) -> None:
    t = _table("Batch claims: scopes/s (medians); speed-up over single create()",
               ["store", "mode", "scopes/s", "speed-up"])
    for kind, row in data.items():
        for mode, rate in row["scopes_per_s"].items():
            t.add_row(kind, mode, _num(rate, 0), _ratio(row["speedup"].get(mode)))
    console.print(t)


def memory_table(data: dict[str, Any], console: Console) -> None:
    t = _table("Storage per 1M SUCCESS records", ["store", "detail", "records inserted",
               "bytes/record", "MiB per 1M", "extrapolated"])
    for kind, row in data.items():
        if "error" in row:
            t.add_row(kind, row["error"][:60], "-", "-", "-", "-")
            continue
        rows = row.items() if "before VACUUM" in row else [("", row)]
        for detail, r in rows:
            extra = r.get("record_encoding", "")
            t.add_row(kind, detail or extra, _num(r["records"], 0), _num(r["bytes_per_record"]),
                      _num(r["per_1M_MiB"]), "yes" if r["extrapolated"] else "no")
    console.print(t)


def cpu_table(data: dict[str, Any], console: Console) -> None:
    small, large = data["n"]
    ref = data.get("baseline_ref")
    columns = ["delivery", "metrics", "instructions, this tree"]
    if ref:
        columns += [f"instructions at {ref}", "ratio now / then"]
    t = _table(f"CPU per delivery on MemoryStore, instructions (callgrind; the difference of "
               f"runs of {small} and {large} deliveries over {large - small})", columns)
    for name, row in data["ours"].items():
        cells = [*name.split(", ", 1), _num(row["instructions"], 0)]
        if ref:
            cells += [_num(data["baseline"][name]["instructions"], 0), _ratio(data["ratio"][name])]
        t.add_row(*cells)
    console.print(t)


def scaling_table(data: dict[str, Any], console: Console) -> None:
    from .scaling import plan_excerpt

    size = data["table_size"]
    t = _table("PostgreSQL: execute() vs table size (all sizes interleaved)",
               ["records", "fill s", "first µs", "first vs 10⁴", "replay µs", "replay vs 10⁴"])
    for n, row in size["sizes"].items():
        t.add_row(f"{int(n):,}", _num(row["fill_s"]), _num(row["first_us"]),
                  _ratio(row["first_vs_smallest"]), _num(row["replay_us"]),
                  _ratio(row["replay_vs_smallest"]))
    console.print(t)
    console.print(f"EXPLAIN (ANALYZE, BUFFERS) excerpts at {int(size['explain_at']):,} records:")
    for name, lines in size["explain"].items():
        console.print(f"  [bold]{name}[/]")
        for line in plan_excerpt(lines):
            console.print("    " + line, markup=False)
    c = _table("Concurrency: first deliveries on distinct keys", ["store", "workers",
               "ops/s", "speed-up", "p50 µs", "p95 µs"])
    for kind, rows in data["concurrency"].items():
        for workers, r in rows.items():
            c.add_row(kind, workers, _num(r["ops_per_s"], 0), _ratio(r["speedup"]),
                      _num(r["p50_us"]), _num(r["p95_us"]))
    console.print(c)
    k = _table("Cleanup of expired records: cleanup_expired_records(limit) in a loop",
               ["store", "limit", "records", "calls", "s per 10⁵", "records/s"])
    for kind, rows in data["cleanup"].items():
        for limit, r in rows.items():
            k.add_row(kind, limit, _num(r["records"], 0), _num(r["calls"], 0),
                      _num(r["s_per_1e5"], 2), _num(r["records_per_s"], 0))
    console.print(k)


def targets_table(data: list[dict[str, Any]], console: Console) -> None:
    t = _table("Targets (from this run)", ["target", "measured", "limit", "result"])
    for row in data:
        colour = {"PASS": "green", "FAIL": "red"}.get(row["result"], "yellow")
        t.add_row(row["target"], row["measured"], row["limit"],
                  f"[{colour}]{row['result']}[/]")
    console.print(t)


PRINTERS: dict[str, Callable[[Any, Console], None]] = {
    "core": core_table, "peers": peers_table, "hotspots": hotspots_table, "e2e": e2e_table,
    "consumers": consumers_table, "batch": batch_table, "memory": memory_table,
    "cpu": cpu_table, "scaling": scaling_table, "targets": targets_table,
}


def print_section(name: str, data: Any, report: dict[str, Any], console: Console) -> None:
    console.print()
    if isinstance(data, dict) and "error" in data and len(data) == 1:
        console.print(f"[red]{name}: {data['error']}[/]")
        return
    PRINTERS[name](data, console)


# --------------------------------------------------------------------------- targets
def _check(target: str, value: float | None, limit: float, fmt: str = "{:.2f}x",
           at_least: bool = False) -> dict[str, str]:
    if value is None:
        return {"target": target, "measured": "-", "limit": "-", "result": "NOT RUN"}
    ok = value >= limit if at_least else value <= limit
    sign = "≥" if at_least else "≤"
    return {"target": target, "measured": fmt.format(value), "limit": f"{sign} {fmt.format(limit)}",
            "result": "PASS" if ok else "FAIL"}


def _get(report: dict[str, Any], *path: str) -> Any:
    node: Any = report
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    rows = [
        _check("first delivery vs Redis floor (claim script + complete)",
               _get(report, "core", "redis", "first delivery", "ratio"), 1.3),
        _check("first delivery vs psycopg floor (INSERT…RETURNING + UPDATE)",
               _get(report, "core", "postgresql", "first delivery", "ratio"), 1.5),
        _check("replay vs Redis claim-or-get floor (one Lua call)",
               _get(report, "core", "redis", "replay (store)", "ratio"), 1.3),
        _check("replay vs PostgreSQL claim-or-get floor (one WITH ins … statement)",
               _get(report, "core", "postgresql", "replay (store)", "ratio"), 1.3),
        *(_check(f"{measure} vs the minimal {name} floor ({floor})",
                 _get(report, "core", kind, measure, "ratio_minimal"), 1.15)
          for kind, name in (("postgresql", "PostgreSQL"), ("redis", "Redis"))
          for measure, floor in (("first delivery", "claim + complete"),
                                 ("replay (store)", "claim-or-get"))),
        _check("replay from local cache vs Powertools' cached replay",
               _get(report, "peers", "powertools (redis)", "replay (local cache)", "ratio"), 0.5),
    ]
    for measure in ("first delivery", "replay (store)", "replay (local cache)"):
        rows.append(_check(f"ahead of Powertools: {measure} (ours/peer)",
                           _get(report, "peers", "powertools (redis)", measure, "ratio"), 1.0))
    for fw in ("celery", "dramatiq"):
        for kind in ("redis", "postgresql"):
            rows.append(_check(
                f"{fw} end-to-end cost per task vs {kind} claim+complete floor in the worker",
                _get(report, "e2e", fw, kind, "ratio_to_worker_floor"), 1.2))
            rows.append(_check(
                f"{fw} end-to-end cost per task vs {kind} claim+complete floor in a loop",
                _get(report, "e2e", fw, kind, "ratio_to_floor"), 1.5))
    for kind, limit in (("redis", 100_000), ("postgresql", 50_000)):
        rates = _get(report, "batch", kind, "scopes_per_s") or {}
        best = max((v for k, v in rates.items() if k.startswith("create_many")), default=None)
        rows.append(_check(f"batch claims on {kind} (best of create_many sizes)", best, limit,
                           "{:,.0f}/s", at_least=True))
    return rows + floor_and_cpu_targets(report)


def floor_and_cpu_targets(report: dict[str, Any]) -> list[dict[str, str]]:
    """The embedded default against its floor, the memory store's instructions per
    delivery (half of a7d21ef's), Kafka batches of 100 with batched completion."""
    rows = [
        _check(f"SQLite {measure} vs its floor",
               _get(report, "core", "sqlite", measure, "ratio"), 1.5)
        for measure in ("first delivery", "replay (store)")
    ]
    for measure, limit in (("first delivery", 107_800), ("replay (store)", 50_300)):
        rows.append(_check(
            f"instructions per {measure}, memory store, metrics=None",
            _get(report, "cpu", "ours", f"{measure}, metrics=None", "instructions"), limit,
            "{:,.0f}"))
    for kind, limit in (("redis", 40_000), ("postgresql", 25_000)):
        rate = _get(report, "consumers", "kafka", kind, "batch_completion")
        rows.append(_check(f"Kafka batch of 100 with batch_completion on {kind}",
                           rate if isinstance(rate, int | float) else None, limit,
                           "{:,.0f} msg/s", at_least=True))
    return rows
