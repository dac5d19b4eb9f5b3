"""Bad input gets a stable 400-class code and the body never runs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, MemoryStore, Status
from idempotent_tasks.testing import FakeClock


@pytest.fixture
def handler() -> IdempotencyHandler:
    return IdempotencyHandler(MemoryStore(), metrics=None, clock=FakeClock())


def never() -> None:
    raise AssertionError("the body must not run")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


CASES = [
    # (key, tenant, operation, payload, code)
    (None, "t", "op", 1, ErrorCode.MISSING_KEY),
    ("", "t", "op", 1, ErrorCode.MISSING_KEY),
    ("k" * 256, "t", "op", 1, ErrorCode.INVALID_KEY),
    ("a\x00b", "t", "op", 1, ErrorCode.INVALID_KEY),
    ("a\nb", "t", "op", 1, ErrorCode.INVALID_KEY),
    ("\ud800", "t", "op", 1, ErrorCode.INVALID_KEY),
    (b"\xff\xfe", "t", "op", 1, ErrorCode.INVALID_KEY),
    ("   ", "t", "op", 1, ErrorCode.INVALID_KEY),
    (12345, "t", "op", 1, ErrorCode.INVALID_KEY),
    ("k", None, "op", 1, ErrorCode.MISSING_TENANT),
    ("k", "", "op", 1, ErrorCode.MISSING_TENANT),
    ("k", "t" * 256, "op", 1, ErrorCode.INVALID_TENANT),
    ("k", "t\x7f", "op", 1, ErrorCode.INVALID_TENANT),
    ("k", "t", "", 1, ErrorCode.INVALID_OPERATION),
    ("k", "t", "o\x1b", 1, ErrorCode.INVALID_OPERATION),
    ("k", "t", "o" * 256, 1, ErrorCode.INVALID_OPERATION),
    ("k", "t", "op", {"x": math.nan}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {"x": math.inf}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {1: "int key"}, ErrorCode.INVALID_PAYLOAD),
    # past the small-dict loop of the serializer's key check: the set-based checks
    ("k", "t", "op", {**{f"f{i}": i for i in range(9)}, 1: "int key"}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {"a": 1, "b": {"c": [{None: 1}]}}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {"x": object()}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {"x": b"bytes"}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", {"x": {1, 2}}, ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", "x" * (1 << 20), ErrorCode.INVALID_PAYLOAD),
    ("k", "t", "op", nested(5000), ErrorCode.INVALID_PAYLOAD),
]


@pytest.mark.parametrize(("key", "tenant", "operation", "payload", "code"), CASES)
def test_invalid_input_is_refused_before_anything_runs(
    handler: IdempotencyHandler, key: Any, tenant: Any, operation: Any, payload: Any, code: ErrorCode
) -> None:
    with pytest.raises(IdempotencyError) as ei:
        handler.execute(never, operation=operation, tenant=tenant, key=key, payload=payload)
    assert ei.value.code == code
    assert handler._engine.store.list_records() == []  # type: ignore[attr-defined]


def test_keys_are_compared_exactly(handler: IdempotencyHandler) -> None:
    calls: list[str] = []
    for key in ["caf\u00e9", "cafe\u0301", "\u0430pple", "apple", "K", "k"]:  # NFC/NFD, Cyrillic а
        handler.execute(lambda k=key: calls.append(k), operation="op", tenant="t", key=key)
    assert len(calls) == 6


def test_max_length_values_are_accepted(handler: IdempotencyHandler) -> None:
    assert handler.execute(lambda: 1, operation="o" * 255, tenant="t" * 255, key="k" * 255) == 1


def test_metacharacters_are_just_data(handler: IdempotencyHandler) -> None:
    for i, key in enumerate(["'; DROP TABLE x; --", "{tag}", "*", "%s", "$1", "a\\b", "\u202e"]):
        assert handler.execute(lambda i=i: i, operation="op", tenant="t", key=key) == i


def test_payload_limit_is_configurable() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None, max_payload_bytes=10)
    with pytest.raises(IdempotencyError) as ei:
        h.execute(never, operation="op", tenant="t", key="k", payload="x" * 20)
    assert ei.value.code == ErrorCode.INVALID_PAYLOAD


def test_huge_response_poisons_with_clear_code() -> None:
    h = IdempotencyHandler(MemoryStore(), metrics=None, max_response_bytes=100)
    with pytest.raises(IdempotencyError) as ei:
        h.execute(lambda: "x" * 200, operation="op", tenant="t", key="k")
    assert ei.value.code == ErrorCode.RESPONSE_NOT_SERIALIZABLE


def test_missing_key_allowed_when_not_required(handler: IdempotencyHandler) -> None:
    assert handler.execute(lambda: 5, operation="op", tenant=None, key=None, require_key=False) == 5


def test_bad_configuration_is_refused() -> None:
    for kwargs in ({"max_retries": 0}, {"ttl": 0}, {"on_stuck": "maybe"},
                   {"heartbeat_interval": 600, "lease_timeout": 300}):
        with pytest.raises(IdempotencyError) as ei:
            IdempotencyHandler(MemoryStore(), metrics=None, **kwargs)  # type: ignore[arg-type]
        assert ei.value.code == ErrorCode.CONFIGURATION_ERROR


def test_str_subclass_keys_are_accepted_like_their_text(handler: IdempotencyHandler) -> None:
    """A StrEnum key is a string: accepted, small dict or large, and hashed as its text."""
    engine = handler._engine
    for size in (1, 12):  # the serializer's small-dict loop, then its set-based checks
        plain = {"SUCCESS": 1, **{f"f{i}": i for i in range(size - 1)}}
        member = {Status.SUCCESS: 1, **{f"f{i}": i for i in range(size - 1)}}
        assert engine.hash_payload(engine.scope(operation="op", tenant="t", key="k"), member) == (
            engine.hash_payload(engine.scope(operation="op", tenant="t", key="k"), plain)
        )
