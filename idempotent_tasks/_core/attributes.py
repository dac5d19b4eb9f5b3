"""The handler's documented read-only attributes (its settings and services), one place."""

from __future__ import annotations

from collections.abc import Callable

from ..typing import Options
from .engine import Engine
from .logging import Logger
from .metrics import Metrics


class Attributes:
    """``logger``, ``clock``, ``metrics`` and the settings, read from the handler's engine."""

    _engine: Engine

    @property
    def logger(self) -> Logger:
        """The structlog-style logger every decision is logged with."""
        return self._engine.log

    @property
    def clock(self) -> Callable[[], float]:
        """The clock every stored timestamp comes from (epoch seconds)."""
        return self._engine.clock

    @property
    def metrics(self) -> Metrics:
        """The metrics sink (``NoMetrics`` when disabled)."""
        return self._engine.metrics

    @property
    def defaults(self) -> Options:
        """The handler's default per-operation options (``ttl``, ``lease_timeout``, …)."""
        return self._engine.defaults

    @property
    def heartbeat_interval(self) -> float | None:
        """Seconds between lease renewals while a body runs; ``None``: no heartbeat."""
        return self._engine.heartbeat_interval

    @property
    def max_payload_bytes(self) -> int:
        return self._engine.max_payload_bytes

    @property
    def max_response_bytes(self) -> int:
        return self._engine.max_response_bytes


__all__ = ["Attributes"]
