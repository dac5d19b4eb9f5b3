"""The one wrapper every store call goes through: timed, counted, logged, translated.

Fail closed: whatever a store raises that is not already one of the library's errors becomes
``STORE_UNAVAILABLE`` here, so the algorithm only ever sees :class:`IdempotencyError`.  A
store's own ``ConfigurationError`` (a schema that was never created, say) passes through
unchanged: it is not an outage, and retrying cannot fix it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .errors import ConfigurationError, IdempotencyError, StoreUnavailableError
from .logging import Logger
from .metrics import Metrics, NoMetrics
from .records import Scope


class StoreOperation(Protocol):
    """One typed store operation (:mod:`.store_calls`): what this wrapper needs of it."""

    @property
    def name(self) -> str:
        """The store method's name: the metrics' and logs' ``call`` label."""
        ...

    @property
    def subject(self) -> Scope | None:
        """The scope the call is about (maintenance calls have none)."""
        ...

    def invoke(self, store: Any) -> Any:
        """Call the store method: its result, or an awaitable on an async store."""
        ...


class InstrumentedStore:
    """``call(command)`` runs one typed store operation (:mod:`.store_calls`) under the rules
    above."""

    __slots__ = (
        "_latency", "_log", "_metrics", "name", "native_async", "offload", "store",
    )

    def __init__(
        self,
        store: Any,
        metrics: Metrics,
        log: Logger,
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self.store = store
        self.name: str = getattr(store, "name", type(store).__name__)
        self._metrics = metrics
        self._log = log
        #: ``None`` when nobody records latency (``metrics=None``): calls are then not timed.
        self._latency: Callable[[str, str, float], None] | None = (
            None if isinstance(metrics, NoMetrics) else metrics.store_latency
        )
        #: True for an :class:`~idempotent_tasks.stores.AsyncStore` (its methods are
        #: coroutines): awaited on the loop, no thread hop on the async path.
        self.native_async: bool = inspect.iscoroutinefunction(getattr(store, "create", None))
        #: How ``call_async`` runs a sync store's call: ``await offload(fn, *args)`` on the
        #: handler's bounded executor (:mod:`.offload`).
        self.offload = offload

    def call(self, command: StoreOperation) -> Any:
        """Run ``command`` on a sync store."""
        latency = self._latency
        if latency is None:
            try:
                return command.invoke(self.store)
            except Exception as exc:
                raise self.translate(command, exc) from _cause(exc)
        started = time.perf_counter()
        try:
            return command.invoke(self.store)
        except Exception as exc:
            raise self.translate(command, exc) from _cause(exc)
        finally:
            latency(self.name, command.name, time.perf_counter() - started)

    async def call_async(self, command: StoreOperation) -> Any:
        """``call`` on an event loop: awaited on an async store (no thread hop), else run on
        the handler's bounded executor."""
        if not self.native_async:
            offload = self.offload
            if offload is None:
                raise ConfigurationError("this store wrapper has no executor for sync calls")
            return await offload(self.call, command)
        latency = self._latency
        if latency is None:
            try:
                return await command.invoke(self.store)
            except Exception as exc:
                raise self.translate(command, exc) from _cause(exc)
        started = time.perf_counter()
        try:
            return await command.invoke(self.store)
        except Exception as exc:
            raise self.translate(command, exc) from _cause(exc)
        finally:
            latency(self.name, command.name, time.perf_counter() - started)

    def translate(self, command: StoreOperation, exc: Exception) -> IdempotencyError:
        """Log and count a failed call; the error the algorithm sees."""
        name, fields = command.name, _scope_fields(command.subject)
        if isinstance(exc, ConfigurationError):
            self._log.error(
                "store_misconfigured", call=name, store=self.name, error=exc.message,
                **fields,
            )
            return exc
        if isinstance(exc, IdempotencyError) and not isinstance(exc, StoreUnavailableError):
            return exc
        self._metrics.store_error(self.name)
        if isinstance(exc, StoreUnavailableError):
            self._log.error(
                "store_unavailable", call=name, store=self.name, error=exc.message,
                **fields,
            )
            return exc
        self._log.error("store_error", call=name, store=self.name, error=repr(exc), **fields)
        return StoreUnavailableError(f"store call {name} failed: {exc!r}")


def _cause(exc: Exception) -> BaseException | None:
    """Keep a library error's own cause; a driver error becomes the cause of ours."""
    if isinstance(exc, IdempotencyError):
        return exc.__cause__
    return exc


def _scope_fields(s: Scope | None) -> dict[str, str]:
    """The scope of a store call, for its error log line (maintenance calls have none)."""
    if s is None:
        return {}
    return {"tenant": s.tenant, "operation": s.operation, "key": s.key, "status": "UNKNOWN"}


__all__ = ["InstrumentedStore"]
