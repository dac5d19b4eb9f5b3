from __future__ import annotations

import pickle

import pytest

import idempotent_tasks
from idempotent_tasks import ErrorCode, IdempotencyError, idempotency_error_status
from idempotent_tasks._core.errors import DEFAULT_STATUS, ERROR_CLASSES, make_error

DESIGN_NAMES = {
    "IdempotencyHandler", "IdempotencyError", "ErrorCode", "Status", "Record", "MemoryStore",
    "SQLStore", "RedisStore", "MemoryCache", "RedisCache", "PrometheusMetrics",
    "create_logger_adapter", "idempotency_error_status", "current_context", "IdempotencyContext",
    "AsyncSQLStore", "AsyncRedisStore",
}


def test_design_names_are_exported() -> None:
    assert set(idempotent_tasks.__all__) >= DESIGN_NAMES
    for name in idempotent_tasks.__all__:
        assert getattr(idempotent_tasks, name) is not None


def test_every_code_has_a_status_and_a_class() -> None:
    assert set(DEFAULT_STATUS) == set(ErrorCode) == set(ERROR_CLASSES)


@pytest.mark.parametrize(
    ("code", "status"),
    [("MISSING_KEY", 400), ("INVALID_PAYLOAD", 400), ("RECORD_NOT_FOUND", 404),
     ("KEY_REUSED_WITH_DIFFERENT_REQUEST", 409), ("REQUEST_IN_PROGRESS", 409),
     ("REQUEST_FAILED", 409), ("STORE_UNAVAILABLE", 503), ("OUTCOME_NOT_RECORDED", 503),
     ("RESPONSE_NOT_SERIALIZABLE", 500), ("CONFIGURATION_ERROR", 500), ("INTERNAL_ERROR", 500)],
)
def test_status_mapping(code: str, status: int) -> None:
    err = make_error(ErrorCode(code), "m", tenant="t", operation="o", key="k")
    assert err.code == code
    assert isinstance(err, IdempotencyError)
    assert idempotency_error_status(err) == status


def test_status_map_override() -> None:
    err = make_error(ErrorCode.REQUEST_IN_PROGRESS, "m")
    assert idempotency_error_status(err, {"REQUEST_IN_PROGRESS": 425}) == 425
    assert idempotency_error_status(err, {ErrorCode.REQUEST_IN_PROGRESS: 425}) == 425


def test_errors_carry_scope_and_survive_pickling_for_result_backends() -> None:
    err = make_error(ErrorCode.REQUEST_FAILED, "poisoned", tenant="t", operation="o", key="k")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is type(err)
    assert (clone.code, clone.message, clone.tenant, clone.operation, clone.key) == (
        "REQUEST_FAILED", "poisoned", "t", "o", "k")
    assert str(err) == "[REQUEST_FAILED] poisoned"


def test_errors_rebuild_from_args_like_celerys_json_backend() -> None:
    err = make_error(ErrorCode.MISSING_TENANT, "no tenant", operation="o", key="k")
    clone = type(err)(*err.args)
    assert clone.code == "MISSING_TENANT" and clone.operation == "o" and clone.key == "k"
    assert clone.message == "no tenant"
