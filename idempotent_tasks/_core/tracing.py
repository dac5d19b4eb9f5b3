"""OpenTelemetry tracing of every decision, when ``opentelemetry-api`` is installed.

Each ``handler.run`` opens a child span ``idempotency <operation>`` around the whole
decision (claim, body, record), so the body's own spans nest under it, and sets the same
attributes on the span that was current (a Celery task's, a consumer's, a request's):

* ``idempotency.outcome`` (the Outcome kind), ``idempotency.operation``,
  ``idempotency.tenant``, ``idempotency.key``, ``idempotency.retry_count``,
  ``idempotency.fencing_token``; ``idempotency.error_code`` when there is one;
* the messaging semantic-convention attributes the integration knows
  (``messaging.system``, ``messaging.destination.name``, ``messaging.message.id``,
  ``messaging.consumer.group.name``, ``messaging.destination.partition.id``…), handed over
  with :func:`messaging_attributes`;
* status ERROR for ``poisoned`` and ``failed``.

A SUCCESS record keeps the ``traceparent`` of the execution that wrote it (in a small
envelope around the stored response, so every store keeps it without a schema change); a
replay's span links to that execution.  Keys and tenants appear on spans (they identify the
request, as an HTTP span's URL does) but never in metrics.

Nothing is traced, at no cost beyond one check, while no SDK is configured (the API's
global provider is still its proxy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from .outcome import Outcome

try:  # optional: the [otel] extra
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - exercised by the packaging test
    _trace = None  # type: ignore[assignment]

_MESSAGING: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "idempotent_tasks_messaging_attributes", default=None
)
#: Marks a stored response that carries its execution's traceparent (never valid JSON, and
#: long enough that no serializer's output starts with it by accident).
_ENVELOPE = b"\x00idempotent-tasks-trace\x00"
_ERROR_KINDS = frozenset({"poisoned", "failed"})


@contextlib.contextmanager
def messaging_attributes(**attributes: Any) -> Iterator[None]:
    """What an integration knows about the message being processed, for the spans of the
    runs inside this block (``messaging.system="kafka"``, …: pass the semantic-convention
    names with ``.`` as ``_``; ``None`` values are left out)."""
    names = {k.replace("_", "."): v for k, v in attributes.items() if v is not None}
    token = _MESSAGING.set(names)
    try:
        yield
    finally:
        _MESSAGING.reset(token)


_TRACER: Any = None
_UNKNOWN = object()


def _tracer() -> Any:
    """The library's tracer, or ``None`` while tracing is off (no API, or no SDK yet).

    An SDK provider, once set, is set for good (the API allows it once), so the tracer is
    kept from then on; until then each run costs one look-up of the global provider."""
    global _TRACER
    if _TRACER is not None or _trace is None:
        return _TRACER
    if getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return None  # the API's own "no provider set yet": the cheapest check there is
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return None
    _TRACER = provider.get_tracer("idempotent_tasks")
    return _TRACER


@contextlib.contextmanager
def decision_span(operation: str) -> Iterator[Any]:
    """The child span of one run, or ``None`` when tracing is off."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        f"idempotency {operation}", record_exception=False, set_status_on_exception=False
    ) as span:
        yield span


def annotate(span: Any, parent: Any, outcome: Outcome, replayed_from: str | None) -> None:
    """Record what was decided on the child span and on the span that was current."""
    attributes: dict[str, Any] = {"idempotency.outcome": outcome.kind}
    for name, value in (
        ("idempotency.operation", outcome.operation),
        ("idempotency.tenant", outcome.tenant),
        ("idempotency.key", outcome.key),
        ("idempotency.fencing_token", outcome.fencing_token),
        ("idempotency.error_code", outcome.error_code and outcome.error_code.value),
    ):
        if value is not None:
            attributes[name] = value
    attributes["idempotency.retry_count"] = outcome.retry_count
    messaging = _MESSAGING.get()
    if messaging:
        attributes.update(messaging)
    for target in (span, parent):
        if target is not None and target.is_recording():
            target.set_attributes(attributes)
    if outcome.kind in _ERROR_KINDS:
        span.set_status(Status(StatusCode.ERROR, outcome.detail or outcome.kind))
    replayed = _span_context(replayed_from)
    if replayed is not None:
        span.add_link(replayed, {"idempotency.link": "replayed_execution"})


def current_span() -> Any:
    """The span current before ours opens (to annotate it too), or ``None``."""
    if _trace is None:
        return None
    span = _trace.get_current_span()
    return span if span.is_recording() else None


def exemplar() -> dict[str, str] | None:
    """``{"trace_id": …, "span_id": …}`` of the span being recorded, for a metric's
    exemplar; ``None`` (at the cost of one check) while tracing is off."""
    if _TRACER is None and _tracer() is None:
        return None
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


# -- the traceparent kept with a SUCCESS record -----------------------------------------------
def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, when it is being recorded."""
    if _trace is None:
        return None
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def wrap(encoded: bytes, parent: str | None) -> bytes:
    """The stored form of a response: as it is, or in the envelope with ``parent``."""
    if parent is None:
        return encoded
    return _ENVELOPE + parent.encode("ascii") + b"\n" + encoded


def unwrap(stored: bytes) -> tuple[bytes, str | None]:
    """(the serializer's bytes, the traceparent kept with them or ``None``)."""
    if not stored.startswith(_ENVELOPE):
        return stored, None
    head, _, encoded = stored[len(_ENVELOPE):].partition(b"\n")
    return encoded, head.decode("ascii", "replace")


def _span_context(parent: str | None) -> Any:
    if parent is None or _trace is None:
        return None
    parts = parent.split("-")
    if len(parts) != 4:
        return None
    try:
        ctx = SpanContext(
            trace_id=int(parts[1], 16), span_id=int(parts[2], 16), is_remote=True,
            trace_flags=TraceFlags(int(parts[3], 16)),
        )
    except ValueError:
        return None
    return ctx if ctx.is_valid else None


__all__ = [
    "annotate",
    "current_span",
    "decision_span",
    "exemplar",
    "messaging_attributes",
    "traceparent",
    "unwrap",
    "wrap",
]
