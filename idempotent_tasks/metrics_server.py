"""An opt-in ``/metrics`` endpoint for worker processes.

The library records metrics (``PrometheusMetrics``) but never opens a port by itself: a
library that listens on sockets at import time surprises everyone.  Workers that have no
HTTP server of their own (Celery, Dramatiq, consumer loops) call
:func:`start_metrics_server` once at start-up; it wraps prometheus_client's
``start_http_server`` and returns a handle that can stop it again (tests, graceful shutdown).

It binds to ``127.0.0.1`` by default: exposing metrics beyond the host is a deployment
decision (``addr="0.0.0.0"`` in a container whose port is published to Prometheus only).
With Celery's prefork pool each child process has its own counters: start one server per
child on distinct ports, or use prometheus_client's multiprocess mode (docs/operations.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

DEFAULT_ADDR = "127.0.0.1"


@dataclass(slots=True)
class MetricsServer:
    """A running exporter: ``port`` is the bound port (useful after asking for port 0)."""

    server: Any
    thread: threading.Thread
    addr: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop serving and close the socket; safe to call twice."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_metrics_server(
    port: int, addr: str = DEFAULT_ADDR, registry: Any = None
) -> MetricsServer:
    """Serve ``registry`` (default: prometheus_client's global registry, where
    ``PrometheusMetrics()`` records) at ``http://addr:port/metrics`` from a daemon thread.

    ``port=0`` binds a free port (see :attr:`MetricsServer.port`).
    """
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the metrics server needs prometheus-client: "
            "pip install 'idempotent-tasks[prometheus]'"
        ) from exc
    server, thread = start_http_server(
        port, addr=addr, registry=registry if registry is not None else REGISTRY
    )
    bound_port = int(server.server_address[1])
    return MetricsServer(server=server, thread=thread, addr=addr, port=bound_port)


__all__ = ["MetricsServer", "start_metrics_server"]
