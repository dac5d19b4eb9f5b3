from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import types
from typing import Any

import pytest

import idempotent_tasks
from idempotent_tasks import ErrorCode, IdempotencyError, idempotency_error_status, stores
from idempotent_tasks._core import records
from idempotent_tasks._core.errors import DEFAULT_STATUS, ERROR_CLASSES, make_error
from idempotent_tasks.stores import base

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


# -- the store-author vocabulary ------------------------------------------------------------
STORE_AUTHOR_NAMES = {
    "Store", "AsyncStore", "HotPathStore", "BatchStore", "MaintenanceStore", "AdminStore",
    "AsyncHotPathStore", "AsyncBatchStore", "AsyncMaintenanceStore", "AsyncAdminStore",
    "Scope", "StoredRecord", "CreateResult", "CreateOutcome", "Status", "ClaimRequest",
    "SuccessWrite", "TakeOver", "FailureResult",
}
SYNC_AND_ASYNC = [
    (base.HotPathStore, base.AsyncHotPathStore), (base.BatchStore, base.AsyncBatchStore),
    (base.MaintenanceStore, base.AsyncMaintenanceStore), (base.AdminStore, base.AsyncAdminStore),
    (base.Store, base.AsyncStore), (base.BodyTransaction, base.AsyncBodyTransaction),
]


def test_stores_exports_the_store_author_vocabulary_and_nothing_else() -> None:
    public = {name for name, value in vars(stores).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert set(stores.__all__) == public - {"annotations"}
    assert set(stores.__all__) >= STORE_AUTHOR_NAMES


def test_the_vocabulary_is_the_objects_the_built_in_stores_use() -> None:
    assert stores.Status is idempotent_tasks.Status is records.Status
    for name in ("Scope", "StoredRecord", "CreateResult", "CreateOutcome"):
        assert getattr(stores, name) is getattr(records, name)
    for name in ("Store", "AsyncStore", "ClaimRequest", "SuccessWrite", "TakeOver",
                 "FailureResult", "TransactionalStore"):
        assert getattr(stores, name) is getattr(base, name)
    memory = idempotent_tasks.MemoryStore()
    assert isinstance(memory, stores.Store)
    scope = stores.Scope("t", "op", "k")
    created = memory.create(scope, request_hash="h", now=1.0, lease_expires_at=2.0)
    assert type(created) is stores.CreateResult and created.outcome is stores.CreateOutcome.CREATED
    assert type(created.record) is stores.StoredRecord
    failure = memory.record_failure(scope, token=created.record.fencing_token, now=1.0,
                                    max_retries=3, expires_at=9.0)
    assert type(failure) is stores.FailureResult


def _methods(protocol: type) -> dict[str, Any]:
    return {name: getattr(protocol, name) for name in dir(protocol) if not name.startswith("_")}


@pytest.mark.parametrize(("sync", "async_"), SYNC_AND_ASYNC, ids=lambda p: p.__name__)
def test_each_async_protocol_mirrors_its_sync_twin(sync: type, async_: type) -> None:
    """The same methods with the same signatures; on the async face a coroutine each (what a
    body transaction's ``is_intact`` answers stays a plain call)."""
    sync_methods, async_methods = _methods(sync), _methods(async_)
    assert sorted(async_methods) == sorted(sync_methods)
    for name, method in async_methods.items():
        assert inspect.signature(method) == inspect.signature(sync_methods[name]), name
        assert inspect.iscoroutinefunction(method) is (name != "is_intact"), name
    assert "is_async" not in getattr(async_, "__annotations__", {})  # coroutines say it


def test_the_transactional_protocols_open_a_body_transaction() -> None:
    assert sorted(_methods(base.AsyncTransactionalStore)) == sorted(
        _methods(base.TransactionalStore))
    assert "body_transaction" in _methods(base.AsyncTransactionalStore)


def test_testing_needs_pytest_only_for_store_contract() -> None:
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None  # import pytest now raises ImportError\n"
        "import idempotent_tasks.testing as testing\n"
        "testing.FakeClock()\n"
        "try:\n"
        "    testing.StoreContract\n"
        "except ImportError:\n"
        "    print('needs pytest')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "needs pytest"
    from idempotent_tasks import testing

    for name in testing.__all__:
        assert getattr(testing, name) is not None
    assert testing.StoreContract.__module__ == "idempotent_tasks._store_contract"
    assert testing.StoreContract.__name__ == "StoreContract"
