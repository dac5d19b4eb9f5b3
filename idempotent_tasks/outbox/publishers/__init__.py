"""Publishers: how the relay hands staged rows to each broker (the contract is in
``_base``; each broker's module imports its driver only when its publisher is built)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import DEFERRED, SENT, Publisher, PublishResult, State, rejected, unavailable

if TYPE_CHECKING:
    from ._celery import CeleryPublisher
    from ._dramatiq import DramatiqPublisher
    from ._kafka import KafkaPublisher
    from ._rabbitmq import RabbitMQPublisher

_LAZY = {
    "CeleryPublisher": ("._celery", "celery"),
    "DramatiqPublisher": ("._dramatiq", "dramatiq"),
    "KafkaPublisher": ("._kafka", "kafka"),
    "RabbitMQPublisher": ("._rabbitmq", "rabbitmq"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module_name, extra = _LAZY[name]
    try:
        module = importlib.import_module(module_name, __name__)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{name} needs an optional dependency: pip install 'idempotent-tasks[{extra}]'"
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


__all__ = [
    "DEFERRED",
    "SENT",
    "CeleryPublisher",
    "DramatiqPublisher",
    "KafkaPublisher",
    "PublishResult",
    "Publisher",
    "RabbitMQPublisher",
    "State",
    "rejected",
    "unavailable",
]
