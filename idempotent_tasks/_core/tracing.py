"""OpenTelemetry tracing of every decision, when ``opentelemetry-api`` is installed.

Each ``handler.run`` / ``run_async`` / ``execute*`` opens a child span ``idempotency
<operation>`` around the whole decision (claim, body, record), so the body's own spans nest
under it, and sets the ``idempotency.*`` attributes on the span that was current too (a
Celery task's, a consumer's, a request's); ``run_many`` opens one such span per call:

* ``idempotency.outcome`` (the Outcome kind), ``idempotency.operation``,
  ``idempotency.tenant``, ``idempotency.key``, ``idempotency.retry_count``,
  ``idempotency.fencing_token``; ``idempotency.error_code`` when there is one;
* on the child span only, the messaging semantic-convention attributes the integration
  knows (``messaging.system``, ``messaging.destination.name``, ``messaging.message.id``,
  ``messaging.consumer.group.name``, ``messaging.destination.partition.id``…), handed over
  with :func:`messaging_attributes` (or, for one call of a batch, its ``trace_attributes``);
* status ERROR for ``poisoned`` and ``failed`` (with the body's exception as an event).

A SUCCESS record keeps the ``traceparent`` of the execution that wrote it (in a small
envelope around the stored response, so every store keeps it without a schema change); a
replay's span links to that execution.  Keys and tenants appear on spans (they identify the
request, as an HTTP span's URL does) but never in metrics.

While no SDK is configured (the API's global provider is still its proxy, or the API is not
installed) nothing is traced and nothing is stored beside a response, at the cost of one
check per run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

from .outcome import Outcome

try:  # optional: the [otel] extra
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - exercised by the packaging test
    _trace = None  # type: ignore[assignment]
    _context = None  # type: ignore[assignment]


class _NeverOn:
    """Stands in for the API's module when the API is not installed: tracing is never on."""

    _TRACER_PROVIDER = None


class _AlwaysAsk:
    """Stands in for an API that keeps its provider elsewhere: ask :func:`tracer`."""

    _TRACER_PROVIDER = object()


#: ``API._TRACER_PROVIDER is None`` while no SDK provider is set: the API's module global
#: (``set_tracer_provider`` sets it), read inline on the hot path — the one check a run costs
#: while tracing is off (a function call would cost ten times as much).
API: Any = (
    _NeverOn if _trace is None
    else _trace if hasattr(_trace, "_TRACER_PROVIDER") else _AlwaysAsk
)

#: The entry of a ``run_many`` call that holds its own message's attributes (its span's).
ATTRIBUTES_ENTRY = "trace_attributes"
#: The attribute of the link from a replay's span to the execution it replays.
LINK_ATTRIBUTES = {"idempotency.link": "replayed_execution"}

_MESSAGING: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "idempotent_tasks_messaging_attributes", default=None
)
#: True inside a decision's span: a run nested in a body leaves its parent (a decision of
#: its own, with its own attributes) alone.
_IN_DECISION: ContextVar[bool] = ContextVar("idempotent_tasks_in_decision", default=False)
#: Marks a stored response that carries its execution's traceparent (never valid JSON, and
#: long enough that no serializer's output starts with it by accident).
_ENVELOPE = b"\x00idempotent-tasks-trace\x00"
_ERROR_KINDS = frozenset({"poisoned", "failed"})
_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_TRACER: Any = None


# -- is tracing on? ----------------------------------------------------------------------------
def tracer() -> Any:
    """The library's tracer, or ``None`` while tracing is off (no API, or no SDK yet).

    An SDK provider, once set, is set for good (the API allows it once), so the tracer is
    kept from then on.  The hot path calls this only once ``API._TRACER_PROVIDER`` is set."""
    if _TRACER is not None:
        return _TRACER
    if API._TRACER_PROVIDER is None:
        return None  # the API's own "no provider set yet"
    return _resolve()


def _resolve() -> Any:
    global _TRACER
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return None
    _TRACER = provider.get_tracer("idempotent_tasks")
    return _TRACER


# -- what the integration knows ----------------------------------------------------------------
@contextlib.contextmanager
def messaging_attributes(
    attributes: Mapping[str, Any] | None = None, /, **names: Any
) -> Iterator[None]:
    """What an integration knows about the message being processed, for the spans of the
    runs inside this block: a mapping of semantic-convention names
    (``{"messaging.system": "kafka", …}``) and/or keywords with ``.`` written as ``_``
    (``messaging_system="kafka"``).  ``None`` values are left out; an enclosing block's
    attributes stay unless named again (a loop says the system, its consumer the message)."""
    merged = dict(_MESSAGING.get() or {})
    merged.update(attributes or {})
    merged.update((k.replace("_", "."), v) for k, v in names.items())
    token = _MESSAGING.set({k: v for k, v in merged.items() if v is not None})
    try:
        yield
    finally:
        _MESSAGING.reset(token)


def messaging(attributes: Callable[[], Mapping[str, Any]]) -> AbstractContextManager[None]:
    """``messaging_attributes(attributes())`` while tracing is on; while it is off, a shared
    no-op and ``attributes`` is never called (integrations call this on every message)."""
    if API._TRACER_PROVIDER is None or tracer() is None:
        return _NULL
    return messaging_attributes(attributes())


def current_attributes() -> Mapping[str, Any]:
    """The messaging attributes of the enclosing :func:`messaging_attributes` blocks."""
    return _MESSAGING.get() or {}


def enabled() -> bool:
    """True while tracing is on (an SDK provider is set)."""
    return API._TRACER_PROVIDER is not None and tracer() is not None


# -- one run, one span ---------------------------------------------------------------------------
def run(
    tracer_: Any, operation: object, execute: Callable[..., Outcome], *args: Any
) -> Outcome:
    """``execute(*args)`` (one decision) inside its span ``idempotency <operation>``."""
    parent = _parent()
    with tracer_.start_as_current_span(f"idempotency {operation}") as span:
        inside = _IN_DECISION.set(True)
        try:
            outcome = execute(*args)
        except BaseException as exc:
            _propagating(span, exc)
            raise
        finally:
            _IN_DECISION.reset(inside)
        annotate(span, parent, outcome)
    return outcome


async def run_async(
    tracer_: Any, operation: object, execute: Callable[..., Awaitable[Outcome]], *args: Any
) -> Outcome:
    """``run`` for the coroutine of one decision."""
    parent = _parent()
    with tracer_.start_as_current_span(f"idempotency {operation}") as span:
        inside = _IN_DECISION.set(True)
        try:
            outcome = await execute(*args)
        except BaseException as exc:
            _propagating(span, exc)
            raise
        finally:
            _IN_DECISION.reset(inside)
        annotate(span, parent, outcome)
    return outcome


def _parent() -> Any:
    """The span to annotate besides ours: the current one, unless it is not recorded or it
    is a decision's own (this run is nested in a body)."""
    if _IN_DECISION.get():
        return None
    span = _trace.get_current_span()
    return span if span.is_recording() else None


def _propagating(span: Any, exc: BaseException) -> None:
    """A ``BaseException`` out of the body (its attempt already recorded): the API's span
    records ``Exception``s only, so record this one here."""
    if not isinstance(exc, Exception):
        span.record_exception(exc)


def annotate(
    span: Any, parent: Any, outcome: Outcome, own: Mapping[str, Any] | None = None
) -> None:
    """Record what was decided on the child span and on the span that was current; ``own``:
    the messaging attributes of this call alone (a call of a batch)."""
    attributes = _attributes(outcome)
    if parent is not None and parent is not span:
        parent.set_attributes(attributes)
    if not span.is_recording():
        return
    messaging_ = _MESSAGING.get()
    if messaging_:
        attributes.update(messaging_)
    if own:
        attributes.update((k, v) for k, v in own.items() if v is not None)
    span.set_attributes(attributes)
    if outcome.kind in _ERROR_KINDS:
        span.set_status(Status(StatusCode.ERROR, outcome.detail or outcome.kind))
        if outcome.exception is not None:
            span.record_exception(outcome.exception)
    replayed = _span_context(outcome.replayed_from)
    if replayed is not None:
        span.add_link(replayed, LINK_ATTRIBUTES)


def _attributes(outcome: Outcome) -> dict[str, Any]:
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
    return attributes


class BatchSpans:
    """One span per call of a ``run_many`` batch.  The batch claims every scope at once, so
    a call's span opens when its turn comes (``enter`` makes it current while its body runs
    and its outcome is written) and ends when its outcome is known (``finish``), which with
    ``batch_completion`` is after the batch's one success write."""

    __slots__ = ("_inside", "_open", "_own", "_token", "tracer")

    def __init__(self, tracer_: Any, calls: Sequence[Mapping[str, Any]]) -> None:
        self.tracer = tracer_
        self._own = [_own_attributes(c) for c in calls]
        self._open: dict[int, Any] = {}
        self._token: Any = None
        self._inside: Any = None

    def enter(self, index: int, operation: object) -> None:
        span = self.tracer.start_span(f"idempotency {operation}")
        self._open[index] = span
        self._token = _context.attach(_trace.set_span_in_context(span))
        self._inside = _IN_DECISION.set(True)

    def leave(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            _IN_DECISION.reset(self._inside)
            _context.detach(token)

    def traceparent(self, index: int) -> str | None:
        span = self._open.get(index)
        return None if span is None else _format(span.get_span_context())

    def finish(self, index: int, outcome: Outcome) -> None:
        """End call ``index``'s span (opened now if the call never had a turn: its input
        was refused before any I/O)."""
        span = self._open.pop(index, None)
        if span is None:
            span = self.tracer.start_span(f"idempotency {outcome.operation}")
        annotate(span, None, outcome, self._own[index])
        span.end()


def _own_attributes(call: Any) -> Mapping[str, Any] | None:
    own = call.get(ATTRIBUTES_ENTRY) if isinstance(call, Mapping) else None
    return own if isinstance(own, Mapping) else None


# -- exemplars ------------------------------------------------------------------------------------
def exemplar() -> dict[str, str] | None:
    """``{"trace_id": …, "span_id": …}`` of the span being recorded, for a metric's
    exemplar; ``None`` (at the cost of one check) while tracing is off."""
    if API._TRACER_PROVIDER is None or (_TRACER is None and tracer() is None):
        return None
    ctx = _trace.get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


# -- the traceparent kept with a SUCCESS record -------------------------------------------------
def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, when there is a valid one."""
    if _trace is None:
        return None
    return _format(_trace.get_current_span().get_span_context())


def _format(ctx: Any) -> str | None:
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def stored_form(encoded: bytes) -> bytes:
    """What a SUCCESS write stores: ``encoded`` as it is while tracing is off, else in the
    envelope with the traceparent of the current span (the execution's)."""
    if _TRACER is None:
        return encoded
    return wrap(encoded, traceparent())


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
    "API",
    "ATTRIBUTES_ENTRY",
    "BatchSpans",
    "annotate",
    "current_attributes",
    "enabled",
    "exemplar",
    "messaging",
    "messaging_attributes",
    "run",
    "run_async",
    "stored_form",
    "traceparent",
    "tracer",
    "unwrap",
    "wrap",
]
