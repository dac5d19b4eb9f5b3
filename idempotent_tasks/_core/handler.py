"""``IdempotencyHandler``: the public face of the engine.

``run`` / ``run_async`` / ``run_many`` return an :class:`~idempotent_tasks.Outcome` and never
raise for an expected one; ``execute`` / ``execute_async`` / ``execute_in_transaction`` are
``run(...).unwrap()``.  Every integration calls these (and the maintenance and operator
methods of :class:`~.admin.Maintenance`) and nothing else: the algorithm lives in one place.

With an async store (an ``AsyncStore``: its methods are coroutines) ``run_async`` /
``execute_async`` / ``run_many_async`` await every store call on the running loop (no thread
hop); the sync calls refuse with ``CONFIGURATION_ERROR`` naming the call to use.  With a sync
store they run its calls on the handler's bounded executor (``async_executor_threads``,
:mod:`.offload`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from ..typing import (
    DEFAULT_WAIT_TIMEOUT,
    OnFailure,
    OnInProgress,
    OnStuck,
    OnSuccess,
    Options,
    Permanent,
    Reconcile,
    Seconds,
)
from . import tracing
from .attributes import Attributes
from .batch import Mode, execute_many
from .calls import (
    NO_OVERRIDES,
    batch_entry,
    build_flow,
    call_overrides,
    run_call,
    transactional_refusal,
)
from .commands import Command
from .deprecated import DEPRECATED as _DEPRECATED
from .drivers import drive, drive_async, driven, driven_async
from .engine import (
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_OUTCOME_RETRY_TIMEOUT,
    DEFAULT_TTL,
    Engine,
)
from .errors import ConfigurationError
from .logging import Logger
from .metrics import Metrics
from .offload import DEFAULT_ASYNC_EXECUTOR_THREADS
from .outcome import Outcome
from .serialization import Serializer
from .tracing import API as _OTEL
from .unique import UniqueMarks
from .waiting import DEFAULT_MAX_WAITERS

T = TypeVar("T")
Flow = Generator[Command, Any, Outcome]


class IdempotencyHandler(UniqueMarks, Attributes):
    """Runs bodies at most once per scope (see docs/guarantees.md for the algorithm).

    The handler composes its parts: an :class:`~.engine.Engine` (the settings, the pure
    steps of the algorithm and the runtime services: the instrumented store, the executor
    of the thread-hop path, the heartbeat) that the flows run on, and the maintenance and
    operator calls of :class:`~.admin.Maintenance` and the unique-enqueue marks of
    :class:`~.unique.UniqueMarks`.  Its public surface is the documented
    list (docs/design.md, "The handler's public face"): running bodies, maintenance and
    operator calls, ``close``, and the read-only ``logger``, ``clock``, ``metrics`` and
    settings attributes.  The engine's steps are not part of it.
    """


    def __init__(
        self,
        store: Any,
        cache: Any = None,
        *,
        ttl: Seconds = DEFAULT_TTL,
        lease_timeout: Seconds = DEFAULT_LEASE_TIMEOUT,
        heartbeat_interval: Seconds | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        on_stuck: OnStuck = "retry",
        logger: Logger | None = None,
        metrics: Metrics | Literal["auto"] | None = "auto",
        clock: Callable[[], float] = time.time,
        serializer: Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        outcome_retry_timeout: Seconds = DEFAULT_OUTCOME_RETRY_TIMEOUT,
        async_executor_threads: int = DEFAULT_ASYNC_EXECUTOR_THREADS,
        on_in_progress: OnInProgress = "retry",
        wait_timeout: Seconds = DEFAULT_WAIT_TIMEOUT,
        on_success: OnSuccess = "replay",
        reuse_after: Seconds | None = None,
        on_failure: OnFailure = "reject",
        reconcile: Reconcile | None = None,
        max_waiters: int = DEFAULT_MAX_WAITERS,
    ) -> None:
        self._engine = Engine(
            store, cache, ttl=ttl, lease_timeout=lease_timeout,
            heartbeat_interval=heartbeat_interval, max_retries=max_retries, on_stuck=on_stuck,
            logger=logger, metrics=metrics, clock=clock, serializer=serializer,
            max_payload_bytes=max_payload_bytes, max_response_bytes=max_response_bytes,
            outcome_retry_timeout=outcome_retry_timeout,
            async_executor_threads=async_executor_threads, max_waiters=max_waiters,
            on_in_progress=on_in_progress, wait_timeout=wait_timeout, on_success=on_success,
            reuse_after=reuse_after, on_failure=on_failure, reconcile=reconcile,
        )

    def register_operation(
        self,
        operation: str,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> Options:
        """Per-operation defaults (a task's or actor's options): call site > these > the
        handler's."""
        self._engine.register_operation(
            operation, ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries,
            on_stuck=on_stuck, on_in_progress=on_in_progress, wait_timeout=wait_timeout,
            on_success=on_success, reuse_after=reuse_after, on_failure=on_failure,
            reconcile=reconcile,
        )
        return self._engine.options_for(operation)

    def options_for(self, operation: str) -> Options:
        """The options in force for ``operation`` (registered, else the handler's)."""
        return self._engine.options_for(operation)

    def close(self) -> None:
        """Stop the heartbeat and let the executor's threads end (the store stays open: it
        belongs to the caller)."""
        self._engine.close()

    def __getattr__(self, name: str) -> Any:
        """The engine's steps, reachable for one release with a ``DeprecationWarning``."""
        if name in _DEPRECATED:
            warnings.warn(
                f"IdempotencyHandler.{name} is an internal engine step and will be removed; "
                f"{_DEPRECATED[name]}", DeprecationWarning, stacklevel=2,
            )
            return getattr(self._engine, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> Outcome:
        """Run ``fn()`` (``fn(conn)`` with ``transactional=True``) at most once per scope;
        the :class:`Outcome` says what happened.  Never raises for an expected outcome."""
        given = (ttl, lease_timeout, max_retries, on_stuck, on_in_progress, wait_timeout,
                 on_success, reuse_after, on_failure, reconcile)  # in OVERRIDES' order
        # one tuple comparison for the common case (no option at the call site)
        overrides = None if given == NO_OVERRIDES else call_overrides(given)
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None and not transactional:
            return run_call(self._engine, fn, operation, tenant, key, payload, permanent,
                            require_key, overrides)
        flow = build_flow(
            self._engine, fn, operation, tenant, key, payload, permanent, transactional,
            require_key, False, overrides,
        )
        if tracer is None:
            return flow if isinstance(flow, Outcome) else drive(self._engine, flow)
        return tracing.run(tracer, operation, driven, self._engine, flow)

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
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> Outcome:
        """``run`` for a coroutine function: ``afn`` is awaited on the running loop; store
        calls are awaited on an async store (no thread hop) and run on the handler's bounded
        executor on a sync one.  ``transactional=True`` needs an ``AsyncSQLStore``: ``afn``
        then gets the transaction's ``psycopg.AsyncConnection``."""
        given = (ttl, lease_timeout, max_retries, on_stuck, on_in_progress, wait_timeout,
                 on_success, reuse_after, on_failure, reconcile)  # in OVERRIDES' order
        flow = build_flow(
            self._engine, afn, operation, tenant, key, payload, permanent, transactional,
            require_key, True, None if given == NO_OVERRIDES else call_overrides(given),
        )  # one tuple comparison for the common case (no option at the call site)
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None:
            return flow if isinstance(flow, Outcome) else await drive_async(self._engine, flow)
        return await tracing.run_async(tracer, operation, driven_async, self._engine, flow)

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
        return drive(self._engine, flow)

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
        return await drive_async(self._engine, flow)

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
        refusal = transactional_refusal(self._engine, transactional, on_loop, "run_many_async")
        entries = [batch_entry(self._engine, item, refusal) for item in calls]
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        spans = None if tracer is None else tracing.BatchSpans(tracer, calls)
        return execute_many(
            self._engine, entries, fn, Mode(permanent, transactional, batch_completion, spans)
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
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> T:
        """Run ``fn`` at most once per scope; replay, refuse or wait otherwise.  Raises the
        ``IdempotencyError`` of a refusal, or the body's own exception."""
        given = (ttl, lease_timeout, max_retries, on_stuck, on_in_progress, wait_timeout,
                 on_success, reuse_after, on_failure, reconcile)  # in OVERRIDES' order
        # one tuple comparison for the common case (no option at the call site)
        overrides = None if given == NO_OVERRIDES else call_overrides(given)
        tracer = None if _OTEL._TRACER_PROVIDER is None else tracing.tracer()
        if tracer is None:
            outcome = run_call(self._engine, fn, operation, tenant, key, payload, permanent,
                               require_key, overrides)
        else:
            flow = build_flow(self._engine, fn, operation, tenant, key, payload, permanent,
                              False, require_key, False, overrides)
            outcome = tracing.run(tracer, operation, driven, self._engine, flow)
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
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> T:
        """``execute`` for coroutines (``run_async(...).unwrap()``)."""
        outcome = await self.run_async(
            afn, operation=operation, tenant=tenant, key=key, payload=payload,
            permanent=permanent, require_key=require_key, ttl=ttl, lease_timeout=lease_timeout,
            max_retries=max_retries, on_stuck=on_stuck, on_in_progress=on_in_progress,
            wait_timeout=wait_timeout, on_success=on_success, reuse_after=reuse_after,
            on_failure=on_failure, reconcile=reconcile,
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
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> T:
        """Run ``fn(conn)`` in one transaction that also commits SUCCESS (SQL stores)."""
        result: T = self.run(
            fn, operation=operation, tenant=tenant, key=key, payload=payload,
            permanent=permanent, transactional=True, require_key=require_key, ttl=ttl,
            lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
            on_in_progress=on_in_progress, wait_timeout=wait_timeout, on_success=on_success,
            reuse_after=reuse_after, on_failure=on_failure, reconcile=reconcile,
        ).unwrap()
        return result


__all__ = ["IdempotencyHandler"]
