"""The one wrapper every store call goes through: timed, counted, logged, translated.

Fail closed: whatever a store raises that is not already one of the library's errors becomes
``STORE_UNAVAILABLE`` here, so the algorithm only ever sees :class:`IdempotencyError`.  A
store's own ``ConfigurationError`` (a schema that was never created, say) passes through
unchanged: it is not an outage, and retrying cannot fix it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .errors import ConfigurationError, IdempotencyError, StoreUnavailableError
from .logging import Logger
from .metrics import Metrics, NoMetrics
from .records import Scope


class InstrumentedStore:
    """``call(name, args, kwargs)`` runs ``store.<name>(*args, **kwargs)`` under the rules above."""

    __slots__ = (
        "_latency", "_log", "_methods", "_metrics", "name", "native_async", "offload", "store",
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
        self._methods: dict[str, Callable[..., Any]] = {}
        #: True for a store whose methods are coroutines (no thread hop on the async path).
        self.native_async: bool = bool(getattr(store, "is_async", False))
        #: How ``call_async`` runs a sync store's call: ``await offload(fn, *args)`` on the
        #: handler's bounded executor (:mod:`.offload`).
        self.offload = offload

    def method(self, name: str) -> Callable[..., Any]:
        fn = self._methods.get(name)
        if fn is None:
            fn = self._methods[name] = getattr(self.store, name)
        return fn

    def call(self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        fn = self._methods.get(name) or self.method(name)
        latency = self._latency
        if latency is None:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                raise self.translate(name, args, exc) from _cause(exc)
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise self.translate(name, args, exc) from _cause(exc)
        finally:
            latency(self.name, name, time.perf_counter() - started)

    async def call_async(
        self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """``call`` on an event loop: awaited on an async store (no thread hop), else run on
        the handler's bounded executor."""
        if not self.native_async:
            offload = self.offload
            if offload is None:
                raise ConfigurationError("this store wrapper has no executor for sync calls")
            return await offload(self.call, name, args, kwargs)
        fn = self._methods.get(name) or self.method(name)
        latency = self._latency
        if latency is None:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise self.translate(name, args, exc) from _cause(exc)
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            raise self.translate(name, args, exc) from _cause(exc)
        finally:
            latency(self.name, name, time.perf_counter() - started)

    def translate(self, name: str, args: tuple[Any, ...], exc: Exception) -> IdempotencyError:
        """Log and count a failed call; the error the algorithm sees."""
        if isinstance(exc, ConfigurationError):
            self._log.error(
                "store_misconfigured", call=name, store=self.name, error=exc.message,
                **_scope_fields(args),
            )
            return exc
        if isinstance(exc, IdempotencyError) and not isinstance(exc, StoreUnavailableError):
            return exc
        self._metrics.store_error(self.name)
        if isinstance(exc, StoreUnavailableError):
            self._log.error(
                "store_unavailable", call=name, store=self.name, error=exc.message,
                **_scope_fields(args),
            )
            return exc
        self._log.error(
            "store_error", call=name, store=self.name, error=repr(exc), **_scope_fields(args)
        )
        return StoreUnavailableError(f"store call {name} failed: {exc!r}")


def _cause(exc: Exception) -> BaseException | None:
    """Keep a library error's own cause; a driver error becomes the cause of ours."""
    if isinstance(exc, IdempotencyError):
        return exc.__cause__
    return exc


def _scope_fields(args: tuple[Any, ...]) -> dict[str, str]:
    """The scope of a store call, for its error log line (maintenance calls have none)."""
    if args and isinstance(args[0], Scope):
        s = args[0]
        return {"tenant": s.tenant, "operation": s.operation, "key": s.key, "status": "UNKNOWN"}
    return {}


__all__ = ["InstrumentedStore"]
