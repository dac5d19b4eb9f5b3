"""The outbox's metrics, on the registry of the handler's :class:`PrometheusMetrics` (none
when the handler has no Prometheus metrics).

Names and labels (docs/outbox.md): ``idempotency_outbox_staged_total{kind}``,
``idempotency_outbox_published_total{kind}``,
``idempotency_outbox_publish_failures_total{kind,reason}`` (reason ``rejected``: the broker
refused that message, counted as an attempt; ``unavailable``: the broker could not be reached,
not counted), ``idempotency_outbox_poisoned_total{kind}``, the histogram
``idempotency_outbox_lag_seconds{kind}`` (staged → published) and the gauge
``idempotency_outbox_pending`` (rows waiting, as last counted by a relay).  ``kind`` is one of
celery | dramatiq | kafka | rabbitmq: never a key, a tenant or a destination.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from .._core.metrics import PrometheusMetrics

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 1800.0)
_SHARED: weakref.WeakKeyDictionary[Any, PrometheusOutboxMetrics] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class OutboxMetrics(Protocol):
    def staged(self, kind: str) -> None: ...
    def published(self, kind: str, lags: list[float]) -> None: ...
    def publish_failed(self, kind: str, reason: str, count: int = 1) -> None: ...
    def poisoned(self, kind: str) -> None: ...
    def pending(self, count: int) -> None: ...


class NoOutboxMetrics:
    def staged(self, kind: str) -> None:
        pass

    def published(self, kind: str, lags: list[float]) -> None:
        pass

    def publish_failed(self, kind: str, reason: str, count: int = 1) -> None:
        pass

    def poisoned(self, kind: str) -> None:
        pass

    def pending(self, count: int) -> None:
        pass


class PrometheusOutboxMetrics:
    """The collectors of one registry (shared by every relay and body using it)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self._staged = Counter("idempotency_outbox_staged_total",
                               "Messages staged by transactional bodies (counted at send).",
                               ("kind",), registry=registry)
        self._published = Counter("idempotency_outbox_published_total",
                                  "Staged messages published by a relay.", ("kind",),
                                  registry=registry)
        self._failures = Counter("idempotency_outbox_publish_failures_total",
                                 "Publish attempts that failed, by reason.", ("kind", "reason"),
                                 registry=registry)
        self._poisoned = Counter("idempotency_outbox_poisoned_total",
                                 "Staged messages given up on and left for the operator.",
                                 ("kind",), registry=registry)
        self._lag = Histogram("idempotency_outbox_lag_seconds",
                              "Seconds from staging to the broker's confirmation.", ("kind",),
                              buckets=_LAG_BUCKETS, registry=registry)
        self._pending = Gauge("idempotency_outbox_pending",
                              "Staged messages not yet published (last relay count).",
                              registry=registry)

    def staged(self, kind: str) -> None:
        self._staged.labels(kind).inc()

    def published(self, kind: str, lags: list[float]) -> None:
        self._published.labels(kind).inc(len(lags))
        lag = self._lag.labels(kind)
        for seconds in lags:
            lag.observe(max(0.0, seconds))

    def publish_failed(self, kind: str, reason: str, count: int = 1) -> None:
        self._failures.labels(kind, reason).inc(count)

    def poisoned(self, kind: str) -> None:
        self._poisoned.labels(kind).inc()

    def pending(self, count: int) -> None:
        self._pending.set(count)


def outbox_metrics_for(metrics: Any) -> OutboxMetrics:
    """The outbox metrics that go with a handler's ``metrics``: on the same registry when it
    is a :class:`PrometheusMetrics`, none otherwise."""
    if not isinstance(metrics, PrometheusMetrics):
        return NoOutboxMetrics()
    registry = metrics.registry
    with _LOCK:
        found = _SHARED.get(registry)
        if found is None:
            found = _SHARED[registry] = PrometheusOutboxMetrics(registry)
    return found


__all__ = ["NoOutboxMetrics", "OutboxMetrics", "PrometheusOutboxMetrics", "outbox_metrics_for"]
