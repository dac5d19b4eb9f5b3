"""``IdempotencyHandler``: the public face of the engine.

``run`` / ``run_async`` / ``run_many`` return an :class:`~idempotent_tasks.Outcome` and never
raise for an expected one; ``execute`` / ``execute_async`` / ``execute_in_transaction`` are
``run(...).unwrap()``.  Every integration calls these (and the maintenance and operator
methods of :class:`~.admin.Maintenance`) and nothing else: the algorithm lives in one place.

With an async store (``is_async``) ``run_async`` / ``execute_async`` / ``run_many_async``
await every store call on the running loop (no thread hop); the sync calls refuse with
``CONFIGURATION_ERROR`` naming the call to use.  With a sync store they run its calls on the
handler's bounded executor (``async_executor_threads``, :mod:`.offload`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

from ..stores.base import TransactionalStore
from ..typing import OnStuck, Permanent, Seconds
from . import tracing
from .admin import Maintenance
from .batch import Entry, Mode, execute_many
from .commands import Command
from .drivers import drive, drive_async
from .errors import ConfigurationError, IdempotencyError
from .flow import execute, unkeyed
from .outcome import Outcome, refusal_kind
from .tracing import API as _OTEL
from .transactional import execute_in_transaction, unkeyed_in_transaction

T = TypeVar("T")
Flow = Generator[Command, Any, Outcome]


class IdempotencyHandler(Maintenance):
    """Runs bodies at most once per scope (see docs/guarantees.md for the algorithm)."""

    # ------------------------------------------------------------------ running bodies
    def run(
        self,
        fn: Callable[..., Any],
        *,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any = None,
        permanent: Permanent = (),
        transactional: bool = False,
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> Outcome:
        """Run ``fn()`` (``fn(conn)`` with ``transactional=True``) at most once per scope;
        the :class:`Outcome` says what happened.  Never raises for an expected outcome."""
        flow = self._flow(
            fn, operation, tenant, key, payload, permanent, transactional, require_key, ttl,
            lease_timeout, max_retries, on_stuck, False,
        )
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None:
            return flow if isinstance(flow, Outcome) else drive(self, flow)
        return tracing.run(tracer, operation, _driven, self, flow)

    async def run_async(
        self,
        afn: Callable[..., Awaitable[Any]],
        *,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any = None,
        permanent: Permanent = (),
        transactional: bool = False,
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> Outcome:
        """``run`` for a coroutine function: ``afn`` is awaited on the running loop; store
        calls are awaited on an async store (no thread hop) and run on the handler's bounded
        executor on a sync one.  ``transactional=True`` needs an ``AsyncSQLStore``: ``afn``
        then gets the transaction's ``psycopg.AsyncConnection``."""
        flow = self._flow(
            afn, operation, tenant, key, payload, permanent, transactional, require_key, ttl,
            lease_timeout, max_retries, on_stuck, True,
        )
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None:
            return flow if isinstance(flow, Outcome) else await drive_async(self, flow)
        return await tracing.run_async(tracer, operation, _driven_async, self, flow)

    def run_many(
        self,
        calls: Sequence[Mapping[str, Any]],
        fn: Callable[..., Any],
        *,
        permanent: Permanent = (),
        transactional: bool = False,
        batch_completion: bool = False,
    ) -> list[Outcome]:
        """``run`` for a batch, with one store round trip for all the claims (and, with
        ``batch_completion=True``, one for all the successes).  Each call is a mapping of
        ``run``'s keyword arguments (``operation``, ``tenant``, ``key``, ``payload``,
        ``require_key``, ``ttl``, …; ``trace_attributes``: the semantic-convention attributes
        of this call's message, for its span when tracing is on; other entries are ignored);
        the body is ``fn(call)`` (``fn(call, conn)`` with ``transactional=True``).  One
        outcome per call, in order.

        ``batch_completion=True`` writes the successes together after the bodies: a crash
        between a body and that write re-runs the body once its lease expires, so the
        at-least-once window of plain bodies grows from one call to one batch."""
        flow = self._batch(calls, fn, permanent, transactional, batch_completion, False)
        return drive(self, flow)

    async def run_many_async(
        self,
        calls: Sequence[Mapping[str, Any]],
        afn: Callable[..., Awaitable[Any]],
        *,
        permanent: Permanent = (),
        transactional: bool = False,
        batch_completion: bool = False,
    ) -> list[Outcome]:
        """``run_many`` for a coroutine body ``afn(call)`` (``afn(call, conn)`` with
        ``transactional=True``, on an ``AsyncSQLStore``); the same one claim round trip."""
        flow = self._batch(calls, afn, permanent, transactional, batch_completion, True)
        return await drive_async(self, flow)

    def _batch(
        self,
        calls: Sequence[Mapping[str, Any]],
        fn: Callable[..., Any],
        permanent: Permanent,
        transactional: bool,
        batch_completion: bool,
        on_loop: bool,
    ) -> Generator[Command, Any, list[Outcome]]:
        if transactional and batch_completion:
            raise ConfigurationError(
                "batch_completion=True cannot be combined with transactional=True: each "
                "success commits with its own body's transaction"
            )
        refusal = self._transactional_refusal(transactional, on_loop, "run_many_async")
        entries = [self._entry(item, refusal) for item in calls]
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        spans = None if tracer is None else tracing.BatchSpans(tracer, calls)
        return execute_many(
            self, entries, fn, Mode(permanent, transactional, batch_completion, spans)
        )

    def execute(
        self,
        fn: Callable[[], T],
        *,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any = None,
        permanent: Permanent = (),
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> T:
        """Run ``fn`` at most once per scope; replay, refuse or wait otherwise.  Raises the
        ``IdempotencyError`` of a refusal, or the body's own exception."""
        flow = self._flow(
            fn, operation, tenant, key, payload, permanent, False, require_key, ttl,
            lease_timeout, max_retries, on_stuck, False,
        )
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None:
            outcome = flow if isinstance(flow, Outcome) else drive(self, flow)
        else:
            outcome = tracing.run(tracer, operation, _driven, self, flow)
        result: T = outcome.unwrap()
        return result

    async def execute_async(
        self,
        afn: Callable[[], Awaitable[T]],
        *,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any = None,
        permanent: Permanent = (),
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> T:
        """``execute`` for coroutines (``run_async(...).unwrap()``)."""
        outcome = await self.run_async(
            afn, operation=operation, tenant=tenant, key=key, payload=payload,
            permanent=permanent, require_key=require_key, ttl=ttl, lease_timeout=lease_timeout,
            max_retries=max_retries, on_stuck=on_stuck,
        )
        result: T = outcome.unwrap()
        return result

    def execute_in_transaction(
        self,
        fn: Callable[[Any], T],
        *,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any = None,
        permanent: Permanent = (),
        require_key: bool = True,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> T:
        """Run ``fn(conn)`` in one transaction that also commits SUCCESS (SQL stores)."""
        result: T = self.run(
            fn, operation=operation, tenant=tenant, key=key, payload=payload,
            permanent=permanent, transactional=True, require_key=require_key, ttl=ttl,
            lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
        ).unwrap()
        return result

    # ------------------------------------------------------------------ building a flow
    def _flow(
        self,
        fn: Callable[..., Any],
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any,
        permanent: Permanent,
        transactional: bool,
        require_key: bool,
        ttl: Seconds | None,
        lease_timeout: Seconds | None,
        max_retries: int | None,
        on_stuck: OnStuck | None,
        on_loop: bool,
    ) -> Flow | Outcome:
        """The flow for one call, or the outcome its input earns without any I/O."""
        try:
            call = self.prepare(
                operation, tenant, key, payload, require_key, ttl, lease_timeout, max_retries,
                on_stuck,
            )
            if transactional or self.io.native_async:
                refusal = self._transactional_refusal(transactional, on_loop)
                if refusal is not None:
                    raise refusal
        except IdempotencyError as err:
            return _rejected(err, operation, tenant, key)
        if transactional:
            if call is None:
                return unkeyed_in_transaction(self, operation, fn, permanent)
            return execute_in_transaction(self, call, fn, permanent)
        if call is None:
            return unkeyed(self, operation, fn, permanent)
        return execute(self, call, fn, permanent)

    def _transactional_refusal(
        self, transactional: bool, on_loop: bool, twin: str = "run_async"
    ) -> IdempotencyError | None:
        """CONFIGURATION_ERROR for a call this store cannot honour (checked before I/O)."""
        store = self.store
        if self.io.native_async and not on_loop:
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
        if transactional and on_loop and not self.io.native_async:
            return ConfigurationError(
                "transactional coroutine bodies need an async SQL store; use "
                "handler.execute_in_transaction(...) with a synchronous body"
            )
        return None

    def _entry(self, item: Mapping[str, Any], refusal: IdempotencyError | None) -> Entry | Outcome:
        operation = item.get("operation")
        tenant, key = item.get("tenant"), item.get("key")
        try:
            if refusal is not None:
                raise refusal
            call = self.prepare(
                operation,  # type: ignore[arg-type]
                tenant, key, item.get("payload"), item.get("require_key", True),
                item.get("ttl"), item.get("lease_timeout"), item.get("max_retries"),
                item.get("on_stuck"),
            )
        except IdempotencyError as err:
            return _rejected(err, operation, tenant, key)
        return Entry(item, call.scope.operation if call else str(operation), call)


def _driven(engine: IdempotencyHandler, flow: Flow | Outcome) -> Outcome:
    return flow if isinstance(flow, Outcome) else drive(engine, flow)


async def _driven_async(engine: IdempotencyHandler, flow: Flow | Outcome) -> Outcome:
    return flow if isinstance(flow, Outcome) else await drive_async(engine, flow)


def _rejected(err: IdempotencyError, operation: Any, tenant: Any, key: Any) -> Outcome:
    """Input refused before any I/O: nothing ran."""
    return Outcome(
        refusal_kind(err.code, ran=False), error_code=err.code, detail=err.message,
        tenant=_text(err.tenant if err.tenant is not None else tenant),
        operation=_text(err.operation if err.operation is not None else operation),
        key=_text(err.key if err.key is not None else key), refusal=err,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


__all__ = ["IdempotencyHandler"]
