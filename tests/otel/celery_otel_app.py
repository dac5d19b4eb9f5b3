"""The Celery app a tracing test's worker *subprocess* runs (``celery -A
tests.otel.celery_otel_app worker --pool=solo``), traced as users trace theirs:
OpenTelemetry's SDK with ``opentelemetry-instrumentation-celery``, every finished span
written at once (a simple span processor) as a JSON line to ``$IT_OTEL_DIR/spans.jsonl``, so
the spans of a worker that is then SIGKILLed are kept.

``otel.charge(order, mode)``:

* ``mode="kill-after-success"``: the body returns (its SUCCESS is recorded), then the
  worker SIGKILLs itself in ``task_postrun`` — after Celery's ``run/`` span ended, before
  the message is acked (``acks_late``) — once per order: the broker delivers it again.
* ``mode="block-first"``: the first attempt writes ``started-<order>`` and blocks until the
  test SIGKILLs the worker; a later one (a takeover once the lease expired) returns.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery, signals
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.celery import IdempotentTask, setup

WORKDIR = Path(os.environ["IT_OTEL_DIR"])


def span_record(span: ReadableSpan) -> dict[str, Any]:
    ctx, parent = span.context, span.parent
    return {
        "name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "start": span.start_time, "end": span.end_time, "pid": os.getpid(),
        "status": span.status.status_code.name, "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{link.context.trace_id:032x}",
                   "span_id": f"{link.context.span_id:016x}",
                   "attributes": dict(link.attributes or {})} for link in span.links],
    }


class JsonLinesExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with (WORKDIR / "spans.jsonl").open("a") as f:
            for span in spans:
                f.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument(tracer_provider=provider)

app = Celery("celery_otel_app", broker=os.environ["IT_OTEL_BROKER"],
             backend=os.environ["IT_OTEL_BACKEND"])
app.conf.update(
    task_default_queue=os.environ["IT_OTEL_QUEUE"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_heartbeat=0,  # a warm shutdown in ~1 s instead of ~10 s (its poll wakes on it)
)
handler = IdempotencyHandler(SQLStore(os.environ["IT_OTEL_STORE"]), metrics=None,
                             lease_timeout=float(os.environ["IT_OTEL_LEASE"]))
setup(app, handler)


@app.task(base=IdempotentTask, name="otel.charge", wait_backoff=(0.3, 0.6), shared=False)
def charge(order: str, mode: str) -> str:
    started = WORKDIR / f"started-{order}"
    if mode == "block-first" and not started.exists():
        started.write_text(str(os.getpid()))
        threading.Event().wait(120)  # the test SIGKILLs this process here
    return f"charged {order}"


@signals.task_postrun.connect  # after the instrumentation's own handler: its span has ended
def kill_after_success(task: Any = None, args: Any = None, **_: Any) -> None:
    if task is None or task.name != "otel.charge" or args[1] != "kill-after-success":
        return
    marker = WORKDIR / f"killed-{args[0]}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
