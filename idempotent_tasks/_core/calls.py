"""Building the flow of one call (or one batch entry) from its arguments: validation, the
store's capabilities, and which algorithm runs.  Input that earns an outcome without any I/O
(bad key, tenant, payload; a call the store cannot honour) gets it here."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

from ..stores.base import TransactionalStore
from ..typing import (
    Permanent,
)
from .batch import Entry
from .commands import Command
from .drivers import drive, driven
from .engine import Engine
from .errors import ConfigurationError, IdempotencyError
from .flat import run_flat
from .flow import execute, unkeyed
from .outcome import Outcome
from .policies import POLICY_NAMES
from .transactional import execute_in_transaction, unkeyed_in_transaction

Flow = Generator[Command, Any, Outcome]


def build_flow(
    engine: Engine,
    fn: Callable[..., Any],
    operation: str,
    tenant: str | None,
    key: str | None,
    payload: Any,
    permanent: Permanent,
    transactional: bool,
    require_key: bool,
    on_loop: bool,
    overrides: Mapping[str, Any] | None,
) -> Flow | Outcome:
    """The flow for one call, or the outcome its input earns without any I/O."""
    try:
        call = engine.prepare(operation, tenant, key, payload, require_key, overrides)
        if transactional or engine.io.native_async:
            refusal = transactional_refusal(engine, transactional, on_loop)
            if refusal is not None:
                raise refusal
    except IdempotencyError as err:
        return _rejected(err, operation, tenant, key)
    if transactional:
        if call is None:
            return unkeyed_in_transaction(engine, operation, fn, permanent)
        return execute_in_transaction(engine, call, fn, permanent)
    if call is None:
        return unkeyed(engine, operation, fn, permanent)
    return execute(engine, call, fn, permanent)


def run_call(
    engine: Engine,
    fn: Callable[..., Any],
    operation: str,
    tenant: str | None,
    key: str | None,
    payload: Any,
    permanent: Permanent,
    require_key: bool,
    overrides: Mapping[str, Any] | None,
) -> Outcome:
    """One synchronous, non-transactional call, driven to its outcome on this thread: on
    the flat path (:mod:`.flat`) where it applies — a sync store without a cache — else the
    flow.  The caller checked that no tracer is installed."""
    if engine.cache is not None or engine.io.native_async:
        return driven(engine, build_flow(engine, fn, operation, tenant, key, payload,
                                         permanent, False, require_key, False, overrides))
    try:
        call = engine.prepare(operation, tenant, key, payload, require_key, overrides)
    except IdempotencyError as err:
        return _rejected(err, operation, tenant, key)
    if call is None:
        return drive(engine, unkeyed(engine, operation, fn, permanent))
    return run_flat(engine, call, fn, permanent)


def transactional_refusal(
    engine: Engine, transactional: bool, on_loop: bool, twin: str = "run_async"
) -> IdempotencyError | None:
    """CONFIGURATION_ERROR for a call this store cannot honour (checked before I/O)."""
    store = engine.store
    if engine.io.native_async and not on_loop:
        calls = (
            "`await handler.run_async(...)` or `await handler.execute_async(...)`"
            if twin == "run_async" else f"`await handler.{twin}(...)`"
        )
        return ConfigurationError(f"{type(store).__name__} is an async store: use {calls}")
    if transactional and not isinstance(store, TransactionalStore):
        return ConfigurationError(
            f"transactional bodies need a SQL store; {type(store).__name__} cannot share a "
            "transaction with the body"
        )
    if transactional and on_loop and not engine.io.native_async:
        return ConfigurationError(
            "transactional coroutine bodies need an async SQL store; use "
            "handler.execute_in_transaction(...) with a synchronous body"
        )
    return None


def batch_entry(
    engine: Engine, item: Mapping[str, Any], refusal: IdempotencyError | None) -> Entry | Outcome:
    operation = item.get("operation")
    tenant, key = item.get("tenant"), item.get("key")
    try:
        if refusal is not None:
            raise refusal
        call = engine.prepare(
            operation,  # type: ignore[arg-type]
            tenant, key, item.get("payload"), item.get("require_key", True),
            _batch_overrides(item),
        )
    except IdempotencyError as err:
        return _rejected(err, operation, tenant, key)
    return Entry(item, call.scope.operation if call else str(operation), call)


#: Every per-call option of ``run`` that overrides the operation's (in ``Options``' order).
OVERRIDES = ("ttl", "lease_timeout", "max_retries", "on_stuck", *POLICY_NAMES)
#: ``OVERRIDES`` all unset: the common case, compared as one tuple (see ``handler.run``).
NO_OVERRIDES = (None,) * len(OVERRIDES)


def call_overrides(values: tuple[Any, ...]) -> dict[str, Any] | None:
    """The call site's options given in ``OVERRIDES`` order, as keywords; ``None`` when it
    names none."""
    named = {
        name: value for name, value in zip(OVERRIDES, values, strict=True) if value is not None
    }
    return named or None


def _batch_overrides(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """A batch call's own options (``run``'s keyword names), if it names any."""
    if item.keys().isdisjoint(OVERRIDES):  # the common case, one C call per message
        return None
    named = {name: item[name] for name in OVERRIDES if item.get(name) is not None}
    return named or None


def _rejected(err: IdempotencyError, operation: Any, tenant: Any, key: Any) -> Outcome:
    """Input refused before any I/O: nothing ran."""
    return Outcome.refused(
        err, tenant=_text(err.tenant if err.tenant is not None else tenant),
        operation=_text(err.operation if err.operation is not None else operation),
        key=_text(err.key if err.key is not None else key),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


__all__ = [
    "NO_OVERRIDES", "OVERRIDES", "batch_entry", "build_flow", "call_overrides", "run_call",
    "transactional_refusal",
]
