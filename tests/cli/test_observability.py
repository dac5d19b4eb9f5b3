"""The /metrics exporter scraped over HTTP, and the shipped dashboard and alert rules."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from idempotent_tasks import (
    ErrorCode,
    IdempotencyHandler,
    MemoryStore,
    PrometheusMetrics,
    Reconciled,
)
from idempotent_tasks.metrics_server import start_metrics_server
from idempotent_tasks.testing import FakeClock, simulate_crash

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "observability"
METRIC = re.compile(r"\bidempotency_[a-z_]+\b")


def _exposed_names() -> set[str]:
    """Every series name PrometheusMetrics exposes (histograms: _bucket/_sum/_count)."""
    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    names = set()
    for metric in registry.collect():
        if metric.type == "histogram":
            names |= {f"{metric.name}_{s}" for s in ("bucket", "sum", "count")}
        elif metric.type == "counter":
            names.add(f"{metric.name}_total")
    return names


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return str(response.read().decode())


def _value(body: str, series: str) -> float:
    for line in body.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in scrape:\n{body}")


def test_metrics_endpoint_serves_the_handlers_metrics() -> None:
    registry = CollectorRegistry()
    handler = IdempotencyHandler(MemoryStore(), metrics=PrometheusMetrics(registry))
    for _ in range(3):
        handler.execute(lambda: 1, operation="pay", tenant="t", key="k", payload=None)
    with pytest.raises(ValueError):
        handler.execute(_fail, operation="pay", tenant="t", key="k2", permanent=(ValueError,))

    server = start_metrics_server(0, registry=registry)
    try:
        assert server.port > 0 and server.url.endswith(f":{server.port}/metrics")
        body = _scrape(f"http://127.0.0.1:{server.port}/metrics")
        assert _value(body, 'idempotency_executions_total{operation="pay",outcome="success"}') == 1
        assert _value(
            body, 'idempotency_executions_total{operation="pay",outcome="permanent_failure"}'
        ) == 1
        assert _value(body, 'idempotency_duplicates_total{operation="pay",status="SUCCESS"}') == 2
        assert _value(body, 'idempotency_poisoned_total{operation="pay"}') == 1
        assert _value(body, "idempotency_recovered_total") == 0
        assert 'idempotency_store_seconds_count{call="create",store="memory"}' in body

        handler.execute(lambda: 1, operation="pay", tenant="t", key="k3")
        body = _scrape(server.url)  # live values, not a snapshot
        assert _value(body, 'idempotency_executions_total{operation="pay",outcome="success"}') == 2
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        _scrape(server.url)
    server.stop()  # stopping twice is harmless


def _fail() -> None:
    raise ValueError("bad")


def test_marking_a_scope_uncertain_counts_it_per_operation_only() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    handler = IdempotencyHandler(MemoryStore(), metrics=PrometheusMetrics(registry), clock=clock)
    scope = {"operation": "pay", "tenant": "tenant-secret", "key": "key-secret"}
    simulate_crash(handler, **scope, lease_timeout=5)
    clock.advance(6)
    for _ in range(2):  # the marking counts; the refused duplicate after it does not
        outcome = handler.run(lambda: 1, **scope, on_stuck="reconcile",
                              reconcile=lambda ctx: Reconciled.unknown("pending"))
        assert outcome.error_code == ErrorCode.OUTCOME_UNCERTAIN
    assert registry.get_sample_value("idempotency_uncertain_total", {"operation": "pay"}) == 1
    (family,) = [m for m in registry.collect() if m.name == "idempotency_uncertain"]
    for sample in family.samples:
        assert set(sample.labels) == {"operation"}, sample
        assert not {"tenant-secret", "key-secret"} & set(sample.labels.values())


def test_metrics_server_default_registry_and_context_manager() -> None:
    with start_metrics_server(0) as server:
        assert server.addr == "127.0.0.1"
        body = _scrape(server.url)
        assert "python_info" in body or "process_" in body or "# HELP" in body
    assert not server.thread.is_alive()


def test_dashboard_is_valid_json_using_only_contract_metrics() -> None:
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= _exposed_names(), used - _exposed_names()
    for required in ("idempotency_executions_total", "idempotency_duplicates_total",
                     "idempotency_poisoned_total", "idempotency_recovered_total",
                     "idempotency_store_errors_total", "idempotency_lease_lost_total",
                     "idempotency_store_seconds_bucket", "idempotency_cleaned_total",
                     "idempotency_cache_hits_total", "idempotency_uncertain_total"):
        assert required in used
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_alert_rules_are_valid_yaml_and_cover_the_failure_modes() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((EXAMPLES / "prometheus-alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    by_name = {r["alert"]: r for r in rules}
    wanted = {
        "IdempotencyDuplicateSpike": "idempotency_duplicates_total",
        "IdempotencyPoisonRateHigh": "idempotency_poisoned_total",
        "IdempotencyStuckRecordsRecovered": "idempotency_recovered_total",
        "IdempotencyStoreErrors": "idempotency_store_errors_total",
        "IdempotencyLeaseLost": "idempotency_lease_lost_total",
        "IdempotencyOutcomeUncertain": "idempotency_uncertain_total",
    }
    for name, metric in wanted.items():
        assert metric in by_name[name]["expr"]
    exposed = _exposed_names()
    for rule in rules:
        assert set(METRIC.findall(rule["expr"])) <= exposed, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")")
    uncertain = by_name["IdempotencyOutcomeUncertain"]
    assert "> 0" in uncertain["expr"]  # any new UNCERTAIN record needs a person
    assert uncertain["annotations"]["runbook_url"].endswith("#runbook-an-uncertain-record")
    operations = (EXAMPLES.parents[1] / "docs" / "operations.md").read_text()
    assert "\n## Runbook: an UNCERTAIN record\n" in operations  # the link's anchor


def test_observability_doc_lists_every_metric_and_alert() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for name in _exposed_names():
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"`{base}`" in doc, base
    alerts = re.findall(r"- alert: (\w+)", (EXAMPLES / "prometheus-alerts.yml").read_text())
    assert alerts
    for alert in alerts:
        assert f"`{alert}`" in doc, alert
    assert "\n## Tracing\n" in doc
