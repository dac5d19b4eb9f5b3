"""The engine's two body signals, against every store (memory, SQLite, PostgreSQL, Redis):

* ``Poison(value)``: the scope is FAILED and keeps ``value`` in the record's ``response``;
  every duplicate gets ``kind="poisoned"`` with that value as ``result`` (``unwrap`` still
  raises ``REQUEST_FAILED``).
* ``Release()``: a counted release, whatever ``permanent=`` says (the counter goes up;
  ``max_retries`` poisons); ``Release(counted=False)``: released without counting or
  poisoning.

Plus the store primitive under both: ``mark_failed(..., response=...)``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import (
    ErrorCode,
    IdempotencyHandler,
    MemoryCache,
    Poison,
    Release,
    RequestFailedError,
    Status,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock

from .conftest import drop_store, make_store

OP = "orders.create"
VALUE = {"status": 422, "body": "the card was declined", "fields": ["card"]}


def make_handler(store: Any, clock: FakeClock, **kw: Any) -> IdempotencyHandler:
    kw.setdefault("metrics", None)
    kw.setdefault("outcome_retry_timeout", 0.2)
    return IdempotencyHandler(store, clock=clock, lease_timeout=30, ttl=3600, **kw)


@pytest.fixture
def handler(store: Store, clock: FakeClock) -> IdempotencyHandler:
    return make_handler(store, clock)


class Body:
    """Raises ``raises`` (when set) on every call, else returns ``"ok"``; counts calls."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.calls = 0
        self.raises = raises

    def __call__(self) -> Any:
        self.calls += 1
        if self.raises is not None:
            raise self.raises
        return "ok"


def run(h: IdempotencyHandler, fn: Any, key: str, **kw: Any) -> Any:
    return h.run(fn, operation=OP, tenant="acme", key=key, payload={"n": 1}, **kw)


def new_key() -> str:
    return uuid.uuid4().hex


# -------------------------------------------------------------------------- Poison(value)
def test_poison_keeps_its_value_and_every_duplicate_gets_it(handler: IdempotencyHandler) -> None:
    body, key = Body(Poison(VALUE)), new_key()
    first = run(handler, body, key)
    assert first.kind == "poisoned" and first.ran
    assert first.result == VALUE and isinstance(first.exception, Poison)
    assert first.error_code == ErrorCode.REQUEST_FAILED
    for _ in range(2):
        again = run(handler, body, key)
        assert again.kind == "poisoned" and not again.ran
        assert again.result == VALUE
        assert again.error_code == ErrorCode.REQUEST_FAILED
        with pytest.raises(RequestFailedError):
            again.unwrap()
    assert body.calls == 1
    record = handler.get_record(operation=OP, tenant="acme", key=key)
    assert record is not None and record.status is Status.FAILED
    assert record.response == VALUE and record.retry_count == 0


def test_poison_is_permanent_whatever_permanent_says(handler: IdempotencyHandler) -> None:
    key = new_key()
    outcome = run(handler, Body(Poison(VALUE)), key, permanent=lambda exc: False)
    assert outcome.kind == "poisoned"
    assert run(handler, Body(), key).result == VALUE


def test_poison_without_a_value_and_a_plain_permanent_error_keep_nothing(
    handler: IdempotencyHandler,
) -> None:
    for raises in (Poison(None), ValueError("declined")):
        key = new_key()
        first = run(handler, Body(raises), key, permanent=(ValueError,))
        assert first.kind == "poisoned" and first.result is None
        again = run(handler, Body(), key)
        assert again.kind == "poisoned" and again.result is None
        record = handler.get_record(operation=OP, tenant="acme", key=key)
        assert record is not None and record.status is Status.FAILED and record.response is None


def test_a_value_that_cannot_be_stored_poisons_without_it(handler: IdempotencyHandler) -> None:
    key = new_key()
    first = run(handler, Body(Poison(object())), key)
    assert first.kind == "poisoned" and first.result is None
    again = run(handler, Body(), key)
    assert again.kind == "poisoned" and again.result is None


def test_the_kept_value_goes_when_the_record_expires(
    handler: IdempotencyHandler, clock: FakeClock
) -> None:
    key = new_key()
    run(handler, Body(Poison(VALUE)), key)
    clock.advance(3601)
    fresh = run(handler, Body(), key)
    assert fresh.kind == "executed" and fresh.result == "ok"
    record = handler.get_record(operation=OP, tenant="acme", key=key)
    assert record is not None and record.status is Status.SUCCESS and record.response == "ok"


def test_a_cache_never_turns_a_kept_failure_into_a_replay(store: Store, clock: FakeClock) -> None:
    handler = make_handler(store, clock, cache=MemoryCache())
    key = new_key()
    run(handler, Body(Poison(VALUE)), key)
    for _ in range(2):
        again = run(handler, Body(), key)
        assert (again.kind, again.result) == ("poisoned", VALUE)


def test_poison_on_the_async_path(handler: IdempotencyHandler) -> None:
    key = new_key()

    async def body() -> Any:
        raise Poison(VALUE)

    async def scenario() -> tuple[Any, Any]:
        first = await handler.run_async(body, operation=OP, tenant="acme", key=key)
        second = await handler.run_async(body, operation=OP, tenant="acme", key=key)
        return first, second

    first, second = asyncio.run(scenario())
    assert (first.kind, first.result) == ("poisoned", VALUE)
    assert (second.kind, second.result, second.ran) == ("poisoned", VALUE, False)


# ------------------------------------------------------------------------------ Release
def test_release_frees_the_scope_without_counting(handler: IdempotencyHandler) -> None:
    key = new_key()
    refused = Body(Release("unauthenticated", counted=False))
    for _ in range(5):  # more than max_retries (3): a release never counts
        outcome = run(handler, refused, key)
        assert outcome.kind == "failed" and outcome.ran
        assert isinstance(outcome.exception, Release)
        assert handler.get_record(operation=OP, tenant="acme", key=key) is None
    assert handler.retry_count(operation=OP, tenant="acme", key=key) == 0
    ok = run(handler, Body(), key)
    assert ok.kind == "executed" and refused.calls == 5


def test_release_is_not_permanent_whatever_permanent_says(handler: IdempotencyHandler) -> None:
    key = new_key()
    outcome = run(handler, Body(Release()), key, permanent=lambda exc: True)
    assert outcome.kind == "failed"
    assert handler.get_record(operation=OP, tenant="acme", key=key) is None


def test_a_counted_release_counts_and_poisons_at_max_retries(
    handler: IdempotencyHandler,
) -> None:
    """``Release()`` forces the transient decision: counted, poisoned at ``max_retries``."""
    key = new_key()
    body = Body(Release("try again later"))
    kinds = [(o.kind, o.retry_count) for o in (run(handler, body, key) for _ in range(4))]
    assert kinds == [("failed", 1), ("failed", 2), ("poisoned", 3), ("poisoned", 3)]
    assert body.calls == 3
    assert handler.retry_count(operation=OP, tenant="acme", key=key) == 3


def test_poison_without_a_result_poisons_whatever_permanent_says(
    handler: IdempotencyHandler,
) -> None:
    key = new_key()
    first = run(handler, Body(Poison()), key, permanent=lambda exc: False)
    second = run(handler, Body(), key)
    assert (first.kind, first.result, second.kind, second.result) == (
        "poisoned", None, "poisoned", None)
    assert Poison(result=VALUE).result == VALUE


def test_a_stale_release_changes_nothing(handler: IdempotencyHandler, clock: FakeClock) -> None:
    """The first attempt's lease expires while it runs; a second attempt takes the scope
    over and succeeds; then the first one raises Release: its release is refused."""
    key = new_key()
    inner: list[Any] = []

    def stale() -> Any:
        clock.advance(31)  # past lease_timeout: the next delivery takes over
        inner.append(run(handler, Body(), key))
        raise Release(counted=False)

    outcome = run(handler, stale, key)
    assert inner[0].kind == "executed"
    assert outcome.kind == "superseded" and not outcome.settled
    record = handler.get_record(operation=OP, tenant="acme", key=key)
    assert record is not None and record.status is Status.SUCCESS and record.response == "ok"


# ------------------------------------------------------------- transactional (SQL stores)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_poison_in_a_transactional_body(kind: str, tmp_path: Path, clock: FakeClock) -> None:
    store = make_store(kind, tmp_path)
    try:
        handler = make_handler(store, clock)
        key = new_key()

        def body(conn: Any) -> Any:
            raise Poison(VALUE)

        first = handler.run(body, operation=OP, tenant="acme", key=key, transactional=True)
        assert (first.kind, first.result) == ("poisoned", VALUE)
        again = handler.run(body, operation=OP, tenant="acme", key=key, transactional=True)
        assert (again.kind, again.result, again.ran) == ("poisoned", VALUE, False)
    finally:
        drop_store(store)


# ------------------------------------------------------------------ the store primitive
def test_mark_failed_keeps_the_response_given(store: Store) -> None:
    scopes = [Scope("acme", OP, new_key()) for _ in range(3)]
    tokens = [
        store.create(s, request_hash="h", now=100.0, lease_expires_at=130.0).record.fencing_token
        for s in scopes
    ]
    assert store.mark_failed(scopes[0], token=tokens[0], now=101.0, expires_at=200.0,
                             response=b'{"kept":1}')
    assert store.mark_failed(scopes[1], token=tokens[1], now=101.0, expires_at=200.0)
    assert not store.mark_failed(scopes[2], token=tokens[2], now=101.0, expires_at=200.0,
                                 only_if_lease_expired=True, response=b"x")  # lease is live
    assert store.mark_failed(scopes[2], token=tokens[2], now=131.0, expires_at=200.0,
                             only_if_lease_expired=True, response=b'"late"')
    kept, plain, late = (store.get(s) for s in scopes)
    assert kept is not None and kept.status is Status.FAILED and kept.response == b'{"kept":1}'
    assert plain is not None and plain.status is Status.FAILED and plain.response is None
    assert late is not None and late.status is Status.FAILED and late.response == b'"late"'
    duplicate = store.create(scopes[0], request_hash="h", now=102.0, lease_expires_at=132.0)
    assert not duplicate.created and duplicate.record is not None
    assert duplicate.record.response == b'{"kept":1}'  # read in the claim's round trip too
