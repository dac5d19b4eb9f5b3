"""An ASCII rendering of exported spans (JSON records, see ``celery_otel_app.span_record``):
one tree per trace, children by start time, the attributes a reader looks for, and each
replay's link to the execution it replays.  docs/observability.md shows its output of a
real run (``test_otel_celery_worker.py`` prints it with ``-s``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

IDEMPOTENCY = ("outcome", "key", "tenant", "retry_count", "fencing_token", "error_code")
MESSAGING = ("system", "destination.name", "message.id")


def render(records: list[dict[str, Any]]) -> str:
    workers = {pid: n for n, pid in enumerate(dict.fromkeys(r["pid"] for r in sorted(
        records, key=lambda r: r["start"])), start=1)}
    by_id = {r["span_id"]: r for r in records}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        parent = r["parent_id"] if r["parent_id"] in by_id else None
        children[parent].append(r)
    lines: list[str] = []
    for root in sorted(children[None], key=lambda r: r["start"]):
        lines.append(f"trace {root['trace_id'][:8]}…")
        _tree(root, children, by_id, workers, lines, "", "")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _tree(
    span: dict[str, Any], children: dict[str | None, list[dict[str, Any]]],
    by_id: dict[str, dict[str, Any]], workers: dict[int, int], lines: list[str],
    head: str, rest: str,
) -> None:
    ms = (span["end"] - span["start"]) / 1e6
    status = "  status=ERROR" if span["status"] == "ERROR" else ""
    attributes = span["attributes"]
    copied = ""
    if not span["name"].startswith("idempotency ") and "idempotency.outcome" in attributes:
        copied = f"  (+ idempotency.outcome={attributes['idempotency.outcome']}, …)"
    lines.append(f"{head}{span['name']}  [worker {workers[span['pid']]}, {ms:.1f} ms]"
                 f"{status}{copied}")
    pad = rest + ("|   " if children[span["span_id"]] else "    ")
    if span["name"].startswith("idempotency "):
        for prefix, names in (("idempotency", IDEMPOTENCY), ("messaging", MESSAGING)):
            shown = [f"{n}={attributes[f'{prefix}.{n}']}" for n in names
                     if f"{prefix}.{n}" in attributes]
            lines.append(f"{pad}  {prefix}: {'  '.join(shown)}")
    for link in span["links"]:
        target = by_id.get(link["span_id"])
        where = (f"{target['name']} in trace {target['trace_id'][:8]}… "
                 f"[worker {workers[target['pid']]}]") if target else link["span_id"]
        lines.append(f"{pad}  ~> link ({link['attributes'].get('idempotency.link')}): {where}")
    kids = sorted(children[span["span_id"]], key=lambda r: r["start"])
    for n, kid in enumerate(kids):
        last = n == len(kids) - 1
        _tree(kid, children, by_id, workers, lines, rest + ("`-- " if last else "|-- "),
              rest + ("    " if last else "|   "))
