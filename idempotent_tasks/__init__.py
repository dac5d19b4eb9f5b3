"""idempotent_tasks: exactly-once effects for task queues on at-least-once delivery.

Optional pieces (SQL, Redis, integrations) import lazily; a missing extra says which one to
install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._core.attempts import Attempt
from ._core.context import current_context
from ._core.errors import (
    ConfigurationError,
    ConflictError,
    DuplicateRejectedError,
    ErrorCode,
    IdempotencyError,
    InvalidInputError,
    KeyReusedError,
    OutcomeNotRecordedError,
    OutcomeUncertainError,
    RecordNotFoundError,
    RequestFailedError,
    RequestInProgressError,
    ResponseNotSerializableError,
    StoreUnavailableError,
    idempotency_error_status,
)
from ._core.handler import IdempotencyHandler
from ._core.logging import create_logger_adapter
from ._core.metrics import Metrics, NoMetrics, PrometheusMetrics
from ._core.outcome import Outcome, OutcomeKind
from ._core.reconcile import Reconciled
from ._core.records import IdempotencyContext, Record, Status
from ._core.runner import MaintenanceRunner, MaintenanceSchedule
from ._core.serialization import JSONSerializer, Serializer
from ._core.signals import Abandon, Poison, Release
from .caches.memory import MemoryCache
from .stores.memory import MemoryStore

if TYPE_CHECKING:
    from .caches.redis import RedisCache
    from .outbox import current_outbox
    from .stores.async_redis import AsyncRedisStore
    from .stores.async_sql import AsyncSQLStore
    from .stores.dynamodb import DynamoDBStore
    from .stores.redis import RedisStore
    from .stores.sql import SQLStore

_LAZY = {
    "SQLStore": (".stores.sql", "SQLStore", "postgres"),
    "RedisStore": (".stores.redis", "RedisStore", "redis"),
    "AsyncSQLStore": (".stores.async_sql", "AsyncSQLStore", "postgres"),
    "AsyncRedisStore": (".stores.async_redis", "AsyncRedisStore", "redis"),
    "RedisCache": (".caches.redis", "RedisCache", "redis"),
    "DynamoDBStore": (".stores.dynamodb", "DynamoDBStore", "dynamodb"),
    "current_outbox": (".outbox", "current_outbox", "postgres"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr, extra = _LAZY[name]
        try:
            module = importlib.import_module(module_name, __name__)
        except ImportError as exc:
            raise ImportError(
                f"{name} needs an optional dependency: pip install 'idempotent-tasks[{extra}]'"
            ) from exc
        value = getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Abandon",
    "AsyncRedisStore",
    "AsyncSQLStore",
    "Attempt",
    "ConfigurationError",
    "ConflictError",
    "DuplicateRejectedError",
    "DynamoDBStore",
    "ErrorCode",
    "IdempotencyContext",
    "IdempotencyError",
    "IdempotencyHandler",
    "InvalidInputError",
    "JSONSerializer",
    "KeyReusedError",
    "MaintenanceRunner",
    "MaintenanceSchedule",
    "MemoryCache",
    "MemoryStore",
    "Metrics",
    "NoMetrics",
    "Outcome",
    "OutcomeKind",
    "OutcomeNotRecordedError",
    "OutcomeUncertainError",
    "Poison",
    "PrometheusMetrics",
    "Reconciled",
    "Record",
    "RecordNotFoundError",
    "RedisCache",
    "RedisStore",
    "Release",
    "RequestFailedError",
    "RequestInProgressError",
    "ResponseNotSerializableError",
    "SQLStore",
    "Serializer",
    "Status",
    "StoreUnavailableError",
    "create_logger_adapter",
    "current_context",
    "current_outbox",
    "idempotency_error_status",
]
