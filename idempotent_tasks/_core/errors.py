"""One error tree, rooted at :class:`IdempotencyError`, every error with a stable code.

Callers and tests rely on ``err.code`` (an :class:`ErrorCode`, which is a ``str`` enum so
``err.code == "REQUEST_FAILED"`` holds); the subclasses exist so that ``except`` clauses can
pick a category.  Driver exceptions are translated at the store boundary
(``raise StoreUnavailableError(...) from exc``), never leaked.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class ErrorCode(enum.StrEnum):
    """Stable, machine-readable codes (a ``str`` enum: ``code == "REQUEST_FAILED"`` holds)."""

    MISSING_KEY = "MISSING_KEY"
    INVALID_KEY = "INVALID_KEY"
    MISSING_TENANT = "MISSING_TENANT"
    INVALID_TENANT = "INVALID_TENANT"
    INVALID_OPERATION = "INVALID_OPERATION"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    RECORD_NOT_FOUND = "RECORD_NOT_FOUND"
    KEY_REUSED_WITH_DIFFERENT_REQUEST = "KEY_REUSED_WITH_DIFFERENT_REQUEST"
    REQUEST_IN_PROGRESS = "REQUEST_IN_PROGRESS"
    REQUEST_FAILED = "REQUEST_FAILED"
    DUPLICATE_REJECTED = "DUPLICATE_REJECTED"
    OUTCOME_UNCERTAIN = "OUTCOME_UNCERTAIN"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    OUTCOME_NOT_RECORDED = "OUTCOME_NOT_RECORDED"
    RESPONSE_NOT_SERIALIZABLE = "RESPONSE_NOT_SERIALIZABLE"
    CONFIGURATION_ERROR = "CONFIGURATION_ERROR"
    INTERNAL_ERROR = "INTERNAL_ERROR"

DEFAULT_STATUS: Mapping[ErrorCode, int] = {
    ErrorCode.MISSING_KEY: 400,
    ErrorCode.INVALID_KEY: 400,
    ErrorCode.MISSING_TENANT: 400,
    ErrorCode.INVALID_TENANT: 400,
    ErrorCode.INVALID_OPERATION: 400,
    ErrorCode.INVALID_PAYLOAD: 400,
    ErrorCode.RECORD_NOT_FOUND: 404,
    ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST: 409,
    ErrorCode.REQUEST_IN_PROGRESS: 409,
    ErrorCode.REQUEST_FAILED: 409,
    ErrorCode.DUPLICATE_REJECTED: 409,
    ErrorCode.OUTCOME_UNCERTAIN: 409,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.OUTCOME_NOT_RECORDED: 503,
    ErrorCode.RESPONSE_NOT_SERIALIZABLE: 500,
    ErrorCode.CONFIGURATION_ERROR: 500,
    ErrorCode.INTERNAL_ERROR: 500,
}


class IdempotencyError(Exception):
    """Base of every error the library raises; ``code`` is the stable contract."""

    default_code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        code: ErrorCode | str | None = None,
        tenant: str | None = None,
        operation: str | None = None,
        key: str | None = None,
    ) -> None:
        resolved = ErrorCode(code) if code is not None else self.default_code
        # ``args`` carries everything, so that result backends which rebuild exceptions as
        # ``cls(*args)`` (Celery's JSON backend) keep the code and the scope.
        super().__init__(message, resolved.value, tenant, operation, key)
        self.code: ErrorCode = resolved
        self.message = message
        self.tenant = tenant
        self.operation = operation
        self.key = key

    def __str__(self) -> str:
        return f"[{self.code.value}] {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (Celery results, multiprocessing); keep them picklable
        # by *sending* them, although the library itself never unpickles stored bytes.
        return (
            _rebuild,
            (type(self), self.message, self.code.value, self.tenant, self.operation, self.key),
        )


def _rebuild(
    cls: type[IdempotencyError],
    message: str,
    code: str,
    tenant: str | None,
    operation: str | None,
    key: str | None,
) -> IdempotencyError:
    return cls(message, code=ErrorCode(code), tenant=tenant, operation=operation, key=key)


class InvalidInputError(IdempotencyError):
    """Bad key, tenant, operation or payload: nothing ran (400)."""

    default_code = ErrorCode.INVALID_PAYLOAD


class RecordNotFoundError(IdempotencyError):
    default_code = ErrorCode.RECORD_NOT_FOUND


class ConflictError(IdempotencyError):
    """The scope exists in a state that refuses this delivery (409)."""

    default_code = ErrorCode.REQUEST_IN_PROGRESS


class KeyReusedError(ConflictError):
    default_code = ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST


class RequestInProgressError(ConflictError):
    default_code = ErrorCode.REQUEST_IN_PROGRESS


class RequestFailedError(ConflictError):
    default_code = ErrorCode.REQUEST_FAILED


class DuplicateRejectedError(ConflictError):
    """The scope already succeeded and its operation refuses a second call
    (``on_success="reject"``) instead of replaying the first one's result."""

    default_code = ErrorCode.DUPLICATE_REJECTED


class OutcomeUncertainError(ConflictError):
    """A crashed attempt's effects could not be reconciled: the scope is UNCERTAIN until an
    operator resolves it (``handler.resolve``); nothing runs it again meanwhile."""

    default_code = ErrorCode.OUTCOME_UNCERTAIN


class StoreUnavailableError(IdempotencyError):
    """The store could not be reached or answered with an error; the body did not run."""

    default_code = ErrorCode.STORE_UNAVAILABLE


class OutcomeNotRecordedError(IdempotencyError):
    """The body ran but its outcome could not be written; the lease decides what comes next."""

    default_code = ErrorCode.OUTCOME_NOT_RECORDED


class ResponseNotSerializableError(IdempotencyError):
    default_code = ErrorCode.RESPONSE_NOT_SERIALIZABLE


class ConfigurationError(IdempotencyError):
    default_code = ErrorCode.CONFIGURATION_ERROR


ERROR_CLASSES: Mapping[ErrorCode, type[IdempotencyError]] = {
    ErrorCode.MISSING_KEY: InvalidInputError,
    ErrorCode.INVALID_KEY: InvalidInputError,
    ErrorCode.MISSING_TENANT: InvalidInputError,
    ErrorCode.INVALID_TENANT: InvalidInputError,
    ErrorCode.INVALID_OPERATION: InvalidInputError,
    ErrorCode.INVALID_PAYLOAD: InvalidInputError,
    ErrorCode.RECORD_NOT_FOUND: RecordNotFoundError,
    ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST: KeyReusedError,
    ErrorCode.REQUEST_IN_PROGRESS: RequestInProgressError,
    ErrorCode.REQUEST_FAILED: RequestFailedError,
    ErrorCode.DUPLICATE_REJECTED: DuplicateRejectedError,
    ErrorCode.OUTCOME_UNCERTAIN: OutcomeUncertainError,
    ErrorCode.STORE_UNAVAILABLE: StoreUnavailableError,
    ErrorCode.OUTCOME_NOT_RECORDED: OutcomeNotRecordedError,
    ErrorCode.RESPONSE_NOT_SERIALIZABLE: ResponseNotSerializableError,
    ErrorCode.CONFIGURATION_ERROR: ConfigurationError,
    ErrorCode.INTERNAL_ERROR: IdempotencyError,
}


def make_error(
    code: ErrorCode,
    message: str,
    *,
    tenant: str | None = None,
    operation: str | None = None,
    key: str | None = None,
) -> IdempotencyError:
    """Build the error of the right category for ``code``."""
    cls = ERROR_CLASSES[code]
    return cls(message, code=code, tenant=tenant, operation=operation, key=key)


def idempotency_error_status(
    err: IdempotencyError, status_map: Mapping[str, int] | None = None
) -> int:
    """Map an error to an HTTP-style status; ``status_map`` overrides per code.

    ``status_map`` keys may be :class:`ErrorCode` members or their string values, e.g.
    ``{"REQUEST_IN_PROGRESS": 425}`` for "Too Early" semantics.
    """
    if status_map:
        override = status_map.get(err.code.value)
        if override is not None:
            return override
    return DEFAULT_STATUS.get(err.code, 500)
