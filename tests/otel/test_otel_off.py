"""Tracing off: with no SDK provider set (the API's global is still its proxy) or without the
API at all, nothing is traced, the stored response is the serializer's bytes alone, and the
metrics carry no exemplar.  Each case runs in a subprocess of its own, so that the global
provider has never been set there (a process can set it once)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys
    if sys.argv[1] == "no-api":
        sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest
    from idempotent_tasks import IdempotencyHandler, PrometheusMetrics, SQLStore
    from idempotent_tasks._core import tracing
    from idempotent_tasks._core.records import Scope

    exported = []
    if sys.argv[1] == "no-sdk":  # an SDK with an exporter, never set as the global provider
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        app = provider.get_tracer("app")
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    registry = CollectorRegistry()
    store = SQLStore(f"sqlite:///{sys.argv[2]}")
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=PrometheusMetrics(registry))
    run = lambda: handler.run(lambda: {"charged": 10}, operation="op", tenant="t", key="k")
    if sys.argv[1] == "no-sdk":
        with app.start_as_current_span("app"):  # a span of the app's own, not the global
            outcomes = [run().kind, run().kind]
        exported = [s.name for s in exporter.get_finished_spans()]
    else:
        outcomes = [run().kind, run().kind]
    print(json.dumps({
        "outcomes": outcomes,
        "tracer": tracing.tracer() is not None,
        "api": tracing.API.__name__,
        "stored": store.get(Scope("t", "op", "k")).response.decode("latin-1"),
        "replayed_from": handler.run(lambda: 0, operation="op", tenant="t", key="k").replayed_from,
        "exported": exported,
        "exposition": generate_latest(registry).decode(),
    }))
''')


def _run(case: str, tmp_path: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, case, str(tmp_path / "idem.db")], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _untraced(result: dict[str, object]) -> None:
    assert result["outcomes"] == ["executed", "replayed"]
    assert result["tracer"] is False
    assert result["stored"] == '{"charged":10}'  # no envelope, no traceparent
    assert result["replayed_from"] is None
    exposition = str(result["exposition"])
    assert 'idempotency_executions_total{operation="op",outcome="success"} 1.0' in exposition
    assert "trace_id" not in exposition and " # {" not in exposition


def test_otel_no_sdk_provider_no_spans_no_envelope(tmp_path: Path) -> None:
    result = _run("no-sdk", tmp_path)
    _untraced(result)
    assert result["api"] == "opentelemetry.trace"  # the API is there, its provider is not
    assert result["exported"] == ["app"]  # the app's own span, and nothing of ours


def test_otel_without_the_api_the_library_runs_untraced(tmp_path: Path) -> None:
    result = _run("no-api", tmp_path)
    _untraced(result)
    assert result["api"] == "_NeverOn"  # the stand-in: tracing can never turn on
