"""Exemplars: while a decision is traced, ``idempotency_store_seconds`` and
``idempotency_executions_total`` carry the trace and span id of its span, exposed in the
OpenMetrics format (prometheus-client's own exposition, as a scrape with
``Accept: application/openmetrics-text`` gets it).  Keys and tenants are on spans, never in
metrics, exemplars included."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from idempotent_tasks import IdempotencyHandler, MemoryStore, PrometheusMetrics
from idempotent_tasks.metrics_server import start_metrics_server

from .conftest import Spans, attributes

KEY, TENANT = "key-4f1d-very-unique", "tenant-9c2e-very-unique"


def exemplars(text: str) -> dict[str, tuple[str, str]]:
    """``{"<sample>{<labels>}": (trace_id, span_id)}`` of every sample with an exemplar."""
    out = {}
    for line in text.splitlines():
        if " # {" not in line:
            continue
        sample, exemplar = line.split(" # ", 1)
        ids = dict(re.findall(r'(\w+)="([0-9a-f]+)"', exemplar.split("}", 1)[0]))
        out[sample.rsplit(" ", 1)[0]] = (ids["trace_id"], ids["span_id"])
    return out


def test_otel_exemplars_point_at_the_decision_span(spans: Spans) -> None:
    registry = CollectorRegistry()
    h = IdempotencyHandler(MemoryStore(), metrics=PrometheusMetrics(registry))
    with spans.tracer.start_as_current_span("app"):
        assert h.run(lambda: "ok", operation="op", tenant=TENANT, key=KEY).kind == "executed"
    decision = spans.one()
    assert attributes(decision)["idempotency.key"] == KEY  # the span has it…
    ids = (f"{decision.context.trace_id:032x}", f"{decision.context.span_id:016x}")
    text = openmetrics(registry).decode()
    found = exemplars(text)
    executions = [s for s in found if s.startswith("idempotency_executions_total{")]
    assert executions == ['idempotency_executions_total{operation="op",outcome="success"}']
    latency = {s for s in found if s.startswith("idempotency_store_seconds_bucket{")}
    calls = {re.search(r'call="(\w+)"', s).group(1) for s in latency}  # type: ignore[union-attr]
    assert calls == {"create", "mark_success"}
    assert set(found.values()) == {ids}
    for exposition in (text, generate_latest(registry).decode()):  # …the metrics never
        assert KEY not in exposition and TENANT not in exposition


def test_otel_no_exemplar_without_a_traced_decision(spans: Spans) -> None:
    """The SDK is set, but a store call outside any decision (an operator's read, no span
    current) has no span to point at."""
    registry = CollectorRegistry()
    h = IdempotencyHandler(MemoryStore(), metrics=PrometheusMetrics(registry))
    h.get_record(operation="op", tenant=TENANT, key=KEY)
    assert h.run(lambda: 1, operation="op", tenant=TENANT, key=KEY).kind == "executed"
    text = openmetrics(registry).decode()
    assert 'idempotency_store_seconds_bucket{call="get"' in text
    assert not [s for s in exemplars(text) if 'call="get"' in s]
    assert [s for s in exemplars(text) if 'call="create"' in s]


def test_otel_the_metrics_server_serves_exemplars_to_an_openmetrics_scrape(spans: Spans) -> None:
    """A scrape asking for OpenMetrics (what Prometheus sends) gets the exemplars; the
    classic text format has none (it cannot carry them)."""
    registry = CollectorRegistry()
    h = IdempotencyHandler(MemoryStore(), metrics=PrometheusMetrics(registry))
    h.run(lambda: "ok", operation="op", tenant=TENANT, key=KEY)
    trace_id = f"{spans.one().context.trace_id:032x}"
    server = start_metrics_server(0, registry=registry)
    try:
        def scrape(accept: str) -> tuple[str, str]:
            request = urllib.request.Request(server.url, headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.headers["Content-Type"], response.read().decode()

        kind, text = scrape("application/openmetrics-text; version=1.0.0; charset=utf-8")
        assert kind.startswith("application/openmetrics-text")
        assert {ids[0] for ids in exemplars(text).values()} == {trace_id}
        kind, text = scrape("text/plain")
        assert kind.startswith("text/plain") and not exemplars(text)
    finally:
        server.stop()


def test_otel_the_dashboard_plots_both_exemplar_metrics_linked_to_tempo() -> None:
    path = Path(__file__).resolve().parents[2] / "examples/observability/grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    tempo = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"
             and v["query"] == "tempo"]
    assert [v["name"] for v in tempo] == ["tempo"]
    with_exemplars = {t["expr"].split("(rate(", 1)[1].split("[", 1)[0].split("{", 1)[0]: p
                      for p in dashboard["panels"] for t in p["targets"] if t.get("exemplar")}
    assert set(with_exemplars) == {"idempotency_store_seconds_bucket",
                                   "idempotency_executions_total"}
    for panel in with_exemplars.values():
        (override,) = panel["fieldConfig"]["overrides"]
        assert override["matcher"] == {"id": "byName", "options": "trace_id"}
        (link,) = override["properties"][0]["value"]
        assert link["internal"]["datasourceUid"] == "${tempo}"
