"""OpenTelemetry for the tracing tests: the SDK's global tracer provider with an in-memory
exporter, installed for one test and taken down after it.

The API lets a process set its global provider once; the fixture resets the API's globals
(as OpenTelemetry's own test utilities do) and the library's cached tracer afterwards, so no
other test of the session runs traced.  A test that needs "no SDK at all" runs in a
subprocess instead (``test_otel_off.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from idempotent_tasks._core import tracing


class Spans:
    """The finished spans of the test, by name and by id."""

    def __init__(self, exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
        self.exporter = exporter
        self.provider = provider
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name.startswith(prefix)]

    def decisions(self) -> list[ReadableSpan]:
        return self.named("idempotency ")

    def one(self, prefix: str = "idempotency ") -> ReadableSpan:
        found = self.named(prefix)
        assert len(found) == 1, [s.name for s in self.all()]
        return found[0]

    def clear(self) -> None:
        self.exporter.clear()


def reset_globals() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()
    tracing._TRACER = None


@pytest.fixture
def spans() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_globals()
    trace.set_tracer_provider(provider)
    try:
        yield Spans(exporter, provider)
    finally:
        provider.shutdown()
        reset_globals()


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def link_targets(span: ReadableSpan) -> list[int]:
    """The span ids a span links to (as replays of them)."""
    return [link.context.span_id for link in span.links
            if (link.attributes or {}).get("idempotency.link") == "replayed_execution"]
