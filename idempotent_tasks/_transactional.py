"""Exactly-once effects in one transaction (DESIGN.md §2b).

The claim commits first in its own short transaction, so concurrent duplicates see
PROCESSING.  The body then runs inside one transaction that also performs the conditional
SUCCESS update (status PROCESSING and our fencing token); both commit together.  A crash, an
exception or a lost lease rolls the body's writes back with it.  Counters, releases and
poisoning are written in their own transactions *after* the rollback, so a rollback never
erases a counted failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import ErrorCode, IdempotencyError, StoreUnavailableError
from ._records import Status
from .stores.base import BodyTransaction, TransactionalStore

if TYPE_CHECKING:
    from ._handler import Call, IdempotencyHandler, OnStuck, Permanent, Seconds

T = TypeVar("T")


def run_in_transaction(
    handler: IdempotencyHandler,
    fn: Callable[[Any], T],
    *,
    operation: str,
    tenant: str | None,
    key: str | None,
    payload: Any,
    permanent: Permanent,
    require_key: bool,
    ttl: Seconds | None,
    lease_timeout: Seconds | None,
    max_retries: int | None,
    on_stuck: OnStuck | None,
) -> T:
    store = handler.store
    if not isinstance(store, TransactionalStore):
        raise IdempotencyError(
            f"execute_in_transaction needs a SQLStore; {type(store).__name__} cannot share a "
            "transaction with the body",
            code=ErrorCode.CONFIGURATION_ERROR,
            operation=operation, tenant=tenant, key=key,
        )
    call = handler.prepare(
        operation, tenant, key, payload, require_key, ttl, lease_timeout, max_retries, on_stuck
    )
    if call is None:
        with store.body_transaction() as tx:
            handler.metrics.execution(operation, "unkeyed")
            result = fn(tx.connection)
            tx.commit()
            return result
    claim = handler.claim(call)
    if not claim.owned:
        replayed: T = claim.replay
        return replayed
    return handler.run_claimed(call, claim, fn, permanent, transactional=True)


def run_owned_in_transaction(
    handler: IdempotencyHandler,
    call: Call,
    token: int,
    fn: Callable[[Any], T],
    permanent: Permanent,
) -> T:
    """The body of a scope we own, in one transaction with the conditional SUCCESS."""
    store = handler.store
    if not isinstance(store, TransactionalStore):
        raise call.error(ErrorCode.CONFIGURATION_ERROR, "transactional bodies need a SQLStore")
    try:
        tx_cm = store.body_transaction()
        tx = tx_cm.__enter__()
    except StoreUnavailableError:
        _release_quietly(handler, call, token)
        raise
    try:
        encoded = _body(handler, tx, call, token, fn, permanent)
        now = handler.clock()
        ok = tx.mark_success(
            call.scope, token=token, response=encoded, now=now, expires_at=now + call.options.ttl
        )
        if not ok:
            tx.rollback()
            handler.lease_lost(call)
            return _answer_as_duplicate(handler, call)  # type: ignore[no-any-return]
        _commit(handler, tx, call)
    except BaseException as exc:
        tx_cm.__exit__(type(exc), exc, exc.__traceback__)
        raise
    tx_cm.__exit__(None, None, None)
    handler.metrics.execution(call.scope.operation, "success")
    handler.log.debug("executed", status="SUCCESS", transactional=True, **call.fields())
    value: T = handler.serializer.loads(encoded)
    return value


def _body(
    handler: IdempotencyHandler,
    tx: BodyTransaction,
    call: Call,
    token: int,
    fn: Callable[[Any], Any],
    permanent: Permanent,
) -> bytes:
    """Run the body inside ``tx``; every failure rolls back *before* it is recorded."""
    try:
        result = fn(tx.connection)
    except BaseException as exc:
        tx.rollback()
        handler.on_body_error(call, token, exc, permanent)
        raise
    if not tx.is_intact():
        tx.rollback()
        handler.poison(call, token, reason="body_ended_transaction")
        raise call.error(
            ErrorCode.CONFIGURATION_ERROR,
            "the body committed or rolled back the shared transaction itself",
        )
    try:
        encoded = handler.serializer.dumps(result)
        if len(encoded) > handler.max_response_bytes:
            raise ValueError(f"result is larger than {handler.max_response_bytes} bytes")
    except Exception as exc:
        tx.rollback()
        handler.poison(call, token, reason="response_not_serializable")
        raise call.error(
            ErrorCode.RESPONSE_NOT_SERIALIZABLE, f"the task's result cannot be stored: {exc}"
        ) from exc
    return encoded


def _commit(handler: IdempotencyHandler, tx: BodyTransaction, call: Call) -> None:
    try:
        tx.commit()
    except StoreUnavailableError as exc:
        # The commit may or may not have happened: the lease decides (§2.6).
        raise call.error(
            ErrorCode.OUTCOME_NOT_RECORDED,
            f"commit of the body's transaction failed: {exc.message}",
        ) from exc


def _answer_as_duplicate(handler: IdempotencyHandler, call: Call) -> Any:
    """A stale owner's effects were rolled back: answer as a duplicate would."""
    record = handler.store_call("get", handler.store.get, call.scope)
    if record is not None and record.status is Status.SUCCESS:
        return handler._decode(call, record)
    if record is not None and record.status is Status.FAILED:
        raise call.error(ErrorCode.REQUEST_FAILED, "this scope is poisoned (FAILED)")
    raise call.error(ErrorCode.REQUEST_IN_PROGRESS, "another attempt owns this scope")


def _release_quietly(handler: IdempotencyHandler, call: Call, token: int) -> None:
    with contextlib.suppress(StoreUnavailableError):  # else the lease expires; recovery decides
        handler.store_call("release", handler.store.release, call.scope, token=token)
