"""Metrics: a small protocol, a no-op, and :class:`PrometheusMetrics`.

Names and labels are part of the contract (docs/operations.md, "Metrics").  Labels stay
low-cardinality: operation, outcome, status, store — never keys or tenants.  Durations are in
seconds.
Several ``PrometheusMetrics`` on one registry share their collectors instead of failing.
While an OpenTelemetry span is being recorded, the executions counter and the store latency
histogram carry its trace id as an exemplar (exposed in the OpenMetrics format), so a spike
on a dashboard leads to a trace.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from .tracing import exemplar

OUTCOMES = ("success", "permanent_failure", "transient_failure", "unkeyed")


class Metrics(Protocol):
    def duplicate(self, operation: str, status: str) -> None: ...
    def cache_hit(self, operation: str) -> None: ...
    def cache_error(self, cache: str) -> None: ...
    def execution(self, operation: str, outcome: str) -> None: ...
    def poisoned(self, operation: str) -> None: ...
    def recovered(self, count: int) -> None: ...
    def cleaned(self, count: int) -> None: ...
    def store_error(self, store: str) -> None: ...
    def lease_lost(self, operation: str) -> None: ...
    def store_latency(self, store: str, call: str, seconds: float) -> None: ...


class NoMetrics:
    """Used when metrics are disabled (``metrics=None``)."""

    def duplicate(self, operation: str, status: str) -> None:
        pass

    def cache_hit(self, operation: str) -> None:
        pass

    def cache_error(self, cache: str) -> None:
        pass

    def execution(self, operation: str, outcome: str) -> None:
        pass

    def poisoned(self, operation: str) -> None:
        pass

    def recovered(self, count: int) -> None:
        pass

    def cleaned(self, count: int) -> None:
        pass

    def store_error(self, store: str) -> None:
        pass

    def lease_lost(self, operation: str) -> None:
        pass

    def uncertain(self, operation: str) -> None:
        pass

    def store_latency(self, store: str, call: str, seconds: float) -> None:
        pass


# registry -> its collectors, shared so that several instances on one registry coexist.  Weak
# keys: a registry that is gone takes its collectors with it (an ``id`` could be reused).
_SHARED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)


def _build_collectors(registry: Any) -> dict[str, Any]:
    from prometheus_client import Counter, Histogram

    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        return Counter(name, doc, labels, registry=registry)

    return {
        "duplicates": counter(
            "idempotency_duplicates_total",
            "Deliveries of a scope that already had a record, by the record's status.",
            ("operation", "status"),
        ),
        "cache_hits": counter(
            "idempotency_cache_hits_total", "Replays served by the cache.", ("operation",)
        ),
        "cache_errors": counter(
            "idempotency_cache_errors_total", "Cache failures (swallowed).", ("cache",)
        ),
        "executions": counter(
            "idempotency_executions_total", "Body executions by outcome.", ("operation", "outcome")
        ),
        "poisoned": counter(
            "idempotency_poisoned_total", "Scopes marked FAILED (poisoned).", ("operation",)
        ),
        "recovered": counter("idempotency_recovered", "Stuck records recovered."),
        "cleaned": counter("idempotency_cleaned", "Expired records purged."),
        "store_errors": counter(
            "idempotency_store_errors_total", "Store calls that failed.", ("store",)
        ),
        "lease_lost": counter(
            "idempotency_lease_lost_total",
            "Owners whose outcome write was refused because their lease was taken over.",
            ("operation",),
        ),
        "uncertain": counter(
            "idempotency_uncertain_total",
            "Scopes marked UNCERTAIN by reconciliation (an operator must resolve them).",
            ("operation",),
        ),
        "store_seconds": Histogram(
            "idempotency_store_seconds",
            "Store call latency in seconds.",
            ("store", "call"),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ),
    }


class PrometheusMetrics:
    """Prometheus collectors with the contract's names (``registry=None``: the default)."""

    def __init__(self, registry: Any = None) -> None:
        try:
            from prometheus_client import REGISTRY
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "PrometheusMetrics needs prometheus-client: "
                "pip install 'idempotent-tasks[prometheus]'"
            ) from exc
        self.registry = registry if registry is not None else REGISTRY
        with _SHARED_LOCK:
            collectors = _SHARED.get(self.registry)
            if collectors is None:
                collectors = _SHARED[self.registry] = _build_collectors(self.registry)
        self._c = collectors
        self._latency_children: dict[tuple[str, str], Any] = {}
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, name: str, *labels: str) -> Any:
        """Label look-ups cost microseconds; cache the children (labels are few)."""
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._c[name].labels(*labels)
        return child

    def duplicate(self, operation: str, status: str) -> None:
        self._child("duplicates", operation, status).inc()

    def cache_hit(self, operation: str) -> None:
        self._child("cache_hits", operation).inc()

    def cache_error(self, cache: str) -> None:
        self._c["cache_errors"].labels(cache).inc()

    def execution(self, operation: str, outcome: str) -> None:
        self._child("executions", operation, outcome).inc(1, exemplar())

    def poisoned(self, operation: str) -> None:
        self._c["poisoned"].labels(operation).inc()

    def recovered(self, count: int) -> None:
        self._c["recovered"].inc(count)

    def cleaned(self, count: int) -> None:
        self._c["cleaned"].inc(count)

    def store_error(self, store: str) -> None:
        self._c["store_errors"].labels(store).inc()

    def lease_lost(self, operation: str) -> None:
        self._c["lease_lost"].labels(operation).inc()

    def uncertain(self, operation: str) -> None:
        """A scope marked UNCERTAIN (optional on a custom ``Metrics``: looked up by name)."""
        self._c["uncertain"].labels(operation).inc()

    def store_latency(self, store: str, call: str, seconds: float) -> None:
        child = self._latency_children.get((store, call))
        if child is None:
            child = self._latency_children[(store, call)] = self._c["store_seconds"].labels(
                store, call
            )
        child.observe(seconds, exemplar())


def default_metrics() -> Metrics:
    """``PrometheusMetrics()`` when prometheus-client is installed, else no metrics."""
    try:
        return PrometheusMetrics()
    except ImportError:
        return NoMetrics()
