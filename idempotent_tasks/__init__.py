"""idempotent_tasks: exactly-once effects for task queues on at-least-once delivery."""

from ._errors import ErrorCode, IdempotencyError, idempotency_error_status
from ._records import IdempotencyContext, Record, Status
from .stores.memory import MemoryStore

__all__ = [
    "ErrorCode",
    "IdempotencyContext",
    "IdempotencyError",
    "MemoryStore",
    "Record",
    "Status",
    "idempotency_error_status",
]
