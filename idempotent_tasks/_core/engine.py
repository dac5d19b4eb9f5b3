"""The engine: the settings, the pure steps of the algorithm (validation, hashing,
encoding, options) and the runtime services the flows run on (the instrumented store, the
thread-hop executor, the heartbeat, and the counter reads and lease renewals those two make).

The algorithm itself is in :mod:`.flow` (written once, as generators that yield store
commands); :mod:`.drivers` runs it synchronously or on an event loop.
:class:`~idempotent_tasks.IdempotencyHandler` is the public face, composed around one engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..typing import OnStuck, Options, Seconds, seconds
from .errors import ConfigurationError, ErrorCode, IdempotencyError, InvalidInputError, make_error
from .heartbeat import AsyncHeartbeat, HeartbeatThread, Lease
from .instrumented import InstrumentedStore
from .logging import Logger, default_logger
from .metrics import Metrics, NoMetrics, default_metrics
from .offload import DEFAULT_ASYNC_EXECUTOR_THREADS, Offloader
from .records import Record, Scope, Status, StoredRecord
from .serialization import DEFAULT_SERIALIZER, SerializationError, Serializer, _sha256
from .store_calls import GetRetryCount, Heartbeat
from .tracing import unwrap
from .validation import validate_key, validate_operation, validate_tenant
from .waiting import DEFAULT_MAX_WAITERS, Waiters

if TYPE_CHECKING:
    from ..caches.base import Cache
    from ..stores.base import Store

DEFAULT_TTL = 86_400.0
DEFAULT_LEASE_TIMEOUT = 300.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_OUTCOME_RETRY_TIMEOUT = 30.0
_MAX_ACCEPTED = 4096  # distinct tenants/operations remembered as valid
_new_scope = tuple.__new__  # Scope(...) without the named tuple's Python-level __new__


def _always() -> bool:
    return True


def _bad_payload(scope: Scope, message: str) -> InvalidInputError:
    return InvalidInputError(
        message, code=ErrorCode.INVALID_PAYLOAD,
        tenant=scope.tenant, operation=scope.operation, key=scope.key,
    )


class Call:
    """One validated delivery: its scope, the payload's hash and the options in force."""

    __slots__ = ("options", "request_hash", "scope")

    def __init__(self, scope: Scope, request_hash: str, options: Options) -> None:
        self.scope = scope
        self.request_hash = request_hash
        self.options = options

    def fields(self) -> dict[str, str]:
        s = self.scope
        return {"tenant": s.tenant, "operation": s.operation, "key": s.key}

    def error(self, code: ErrorCode, message: str) -> IdempotencyError:
        s = self.scope
        return make_error(code, message, tenant=s.tenant, operation=s.operation, key=s.key)


class Claim:
    """An attempt that owns its scope: the fencing token, and the counter if it is known."""

    __slots__ = ("counted", "retry_count", "token")

    def __init__(self, token: int, retry_count: int = 0, *, counted: bool = True) -> None:
        self.token = token
        self.retry_count = retry_count
        #: False for a fresh claim: the scope's counter was not read (it is read lazily).
        self.counted = counted


class Engine:
    """Settings shared by every run, the steps of the algorithm that need no I/O, and the
    runtime services (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        cache: Cache | None = None,
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
        max_waiters: int = DEFAULT_MAX_WAITERS,
        **policies: Any,
    ) -> None:
        self.store = store
        self.cache = cache
        self.defaults = Options(
            seconds(ttl), seconds(lease_timeout), max_retries, on_stuck
        ).merged(**policies)
        self.defaults.validate()
        #: Duplicates waiting for a running attempt's outcome (``on_in_progress="wait"``).
        self.waiters = Waiters(max_waiters)
        self.heartbeat_interval = _heartbeat_interval(heartbeat_interval, self.defaults)
        self.log: Logger = logger if logger is not None else default_logger()
        #: Whether debug lines are wanted now (a logger without ``debug_enabled`` always
        #: gets them): the hot paths ask before they build a line's fields.
        self.debug_enabled: Callable[[], bool] = getattr(self.log, "debug_enabled", _always)
        self.metrics: Metrics = (
            default_metrics() if metrics == "auto" else (metrics or NoMetrics())
        )
        self.clock = clock
        self.serializer: Serializer = serializer or DEFAULT_SERIALIZER
        self._dumps = self.serializer.dumps
        self._loads = self.serializer.loads
        self.max_payload_bytes = max_payload_bytes
        self.max_response_bytes = max_response_bytes
        self.outcome_retry_timeout = seconds(outcome_retry_timeout)
        #: The thread-hop path's own bounded executor (a sync store under ``run_async``).
        self.offloader = Offloader(async_executor_threads)
        #: Every store call goes through this wrapper: timed, counted, translated.
        self.io = InstrumentedStore(store, self.metrics, self.log, self.offloader.run)
        #: How the async path calls the cache: ``inline`` (in-process, never blocks),
        #: ``async`` (its methods are coroutines) or ``offload`` (the executor).
        self.cache_mode: Literal["inline", "async", "offload"] = _cache_mode(cache)
        self._operations: dict[str, Options] = {}
        self._accepted: dict[str, str] = {}
        self.heartbeat = self._heartbeat()

    def _heartbeat(self) -> HeartbeatThread | AsyncHeartbeat | None:
        """The lease renewer of running bodies: a thread, or a task on an async store's loop."""
        interval = self.heartbeat_interval
        if interval is None:
            return None
        if self.io.native_async:
            return AsyncHeartbeat(interval, self._renew_async)
        return HeartbeatThread(interval, self._renew)

    # ------------------------------------------------------------------ options
    def register_operation(
        self,
        operation: str,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
        **policies: Any,
    ) -> None:
        """Per-operation defaults (what a task decorator declares); recovery uses them too.
        ``policies``: the per-operation policies (``on_in_progress``, ``wait_timeout``,
        ``on_success``, ``reuse_after``, ``on_failure``)."""
        self._operations[operation] = self.defaults.merged(
            ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
            **policies,
        )

    def options_for(self, operation: str) -> Options:
        return self._operations.get(operation, self.defaults)

    # ------------------------------------------------------------------ validation
    def prepare(
        self,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any,
        require_key: bool,
        overrides: Mapping[str, Any] | None = None,
    ) -> Call | None:
        """Validate and hash; ``None`` means "run unkeyed" (no key, ``require_key=False``).
        ``overrides``: the call site's options (``ttl``, …, the policies), ``None`` when it
        names none.  Runs on every delivery: the memo look-ups and the options are inlined."""
        accepted = self._accepted
        op = accepted.get(operation) if type(operation) is str else None
        if op is None:
            op = self._validated(operation, validate_operation)
        if (key is None or key == "") and not require_key:
            return None
        k = validate_key(key)
        t = accepted.get(tenant) if type(tenant) is str else None
        if t is None:
            t = self._validated(tenant, validate_tenant)
        scope = _new_scope(Scope, (t, op, k))
        options = self._operations.get(op, self.defaults)
        if overrides is not None:
            options = options.merged(**overrides)
        try:
            encoded = self._dumps(payload)
        except (SerializationError, TypeError, ValueError) as exc:
            raise _bad_payload(scope, f"payload is not serialisable: {exc}") from exc
        if len(encoded) > self.max_payload_bytes:
            raise _bad_payload(scope, f"payload is larger than {self.max_payload_bytes} bytes")
        return Call(scope, _sha256(encoded).hexdigest(), options)  # request_hash(), inlined

    def _validated(self, value: object, validate: Callable[[object], str]) -> str:
        """Tenants and operations repeat on every message: validate each distinct one once
        (a bounded memo of values already accepted; keys are unique and always checked)."""
        if type(value) is str:
            hit = self._accepted.get(value)
            if hit is not None:
                return hit
        text = validate(value)
        if type(value) is str:
            if len(self._accepted) >= _MAX_ACCEPTED:
                self._accepted.clear()
            self._accepted[value] = text
        return text

    def scope(self, *, operation: str, tenant: str, key: str) -> Scope:
        """A validated scope for operators' calls (``get_record``, ``unpoison``)."""
        return Scope(validate_tenant(tenant), validate_operation(operation), validate_key(key))

    def hash_payload(self, scope: Scope, payload: Any) -> str:
        """The request hash ``prepare`` computes for ``payload`` (INVALID_PAYLOAD when it
        cannot be encoded or is too large)."""
        call = self.prepare(scope.operation, scope.tenant, scope.key, payload, True)
        assert call is not None  # a key is required: never unkeyed
        return call.request_hash

    # ------------------------------------------------------------------ encoding
    def encode_response(self, call: Call, result: Any) -> bytes:
        """The stored form of a result; RESPONSE_NOT_SERIALIZABLE when it has none."""
        try:
            encoded = self._dumps(result)
            if len(encoded) > self.max_response_bytes:
                raise SerializationError(f"result is larger than {self.max_response_bytes} bytes")
        except (SerializationError, TypeError, ValueError) as exc:
            raise call.error(
                ErrorCode.RESPONSE_NOT_SERIALIZABLE, f"the task's result cannot be stored: {exc}"
            ) from exc
        return encoded

    def decode(self, call: Call, response: bytes | None) -> Any:
        if response is None:
            return None
        try:
            return self.serializer.loads(response)
        except SerializationError as exc:
            raise call.error(ErrorCode.INTERNAL_ERROR, "stored response cannot be decoded") from exc

    def decode_kept(self, call: Call, response: bytes | None) -> Any:
        """The value a FAILED record keeps (see :class:`~.signals.Poison`), or ``None``
        when it keeps none or it cannot be decoded (the refusal stands without it)."""
        try:
            return self.decode(call, response)
        except IdempotencyError:
            self.log.warning("poison_value_not_decoded", **call.fields())
            return None

    def to_record(self, stored: StoredRecord, retry_count: int) -> Record:
        response, detail = None, None
        if stored.status is Status.UNCERTAIN:  # its bytes are the detail (UTF-8), not a result
            detail = (stored.response or b"").decode("utf-8", "replace")
        elif stored.response is not None:
            try:  # without the traceparent a traced execution keeps beside it
                response = self.serializer.loads(unwrap(stored.response)[0])
            except SerializationError:
                response = None
        s = stored.scope
        return Record(
            tenant=s.tenant, operation=s.operation, key=s.key, status=stored.status,
            request_hash=stored.request_hash, response=response, retry_count=retry_count,
            fencing_token=stored.fencing_token, created_at=stored.created_at,
            updated_at=stored.updated_at, lease_expires_at=stored.lease_expires_at,
            expires_at=stored.expires_at, detail=detail,
        )

    @staticmethod
    def expired(record: StoredRecord, now: float) -> bool:
        return record.expires_at is not None and record.expires_at <= now

    # ------------------------------------------------------------------ events
    def debug(self, event: str, call: Call, **fields: Any) -> None:
        """A debug line for a scope (executed, replayed): its fields are built only when
        debug logging is on (a logger without ``debug_enabled`` always gets them)."""
        if self.debug_enabled():
            self.log.debug(event, **call.fields(), **fields)

    def lease_lost(self, call: Call) -> None:
        self.metrics.lease_lost(call.scope.operation)
        self.log.warning("lease_lost", status="PROCESSING", **call.fields())

    def unkeyed(self, operation: str) -> None:
        self.metrics.execution(operation, "unkeyed")
        self.log.info("executed_unkeyed", operation=operation, status="UNKEYED")

    def read_count(self, scope: Scope) -> int:
        """The scope's counter for a body that asks (``current_context().retry_count``);
        0 when the store cannot say (logged and counted by the wrapper)."""
        try:
            count: int = self.io.call(GetRetryCount(scope))
        except IdempotencyError:
            return 0
        return count

    async def read_count_async(self, scope: Scope) -> int:
        """``read_count`` from a coroutine: awaited on an async store, on the executor on a
        sync one — never a blocking call on the loop's thread."""
        try:
            count: int = await self.io.call_async(GetRetryCount(scope))
        except IdempotencyError:
            return 0
        return count

    def read_count_from(self, scope: Scope, loop: asyncio.AbstractEventLoop) -> int:
        """The counter for a body running on ``loop``, read synchronously from another
        thread; on the loop's own thread it would block every coroutine: refused."""
        if _running_loop() is loop:
            raise ConfigurationError(
                "reading current_context().retry_count on the event loop would block it "
                "with a store call: use `await current_context().retry_count_async()`",
                tenant=scope.tenant, operation=scope.operation, key=scope.key,
            )
        if not self.io.native_async:
            return self.read_count(scope)
        if loop.is_closed():
            return 0
        future = asyncio.run_coroutine_threadsafe(self.read_count_async(scope), loop)
        return future.result()

    def _renew_call(self, lease: Lease) -> Heartbeat:
        now = self.clock()
        return Heartbeat(lease.scope, lease.token, now, now + lease.lease_timeout)

    def _renew(self, lease: Lease) -> bool:
        try:
            ok: bool = self.io.call(self._renew_call(lease))
        except IdempotencyError:
            return True  # keep trying; the lease decides if the store stays away
        if not ok:
            self._refused(lease)
        return ok

    async def _renew_async(self, lease: Lease) -> bool:
        try:
            ok: bool = await self.io.call_async(self._renew_call(lease))
        except IdempotencyError:
            return True
        if not ok:
            self._refused(lease)
        return ok

    def _refused(self, lease: Lease) -> None:
        s = lease.scope
        self.log.warning("heartbeat_refused", tenant=s.tenant, operation=s.operation, key=s.key)

    def close(self) -> None:
        """Stop the heartbeat and let the executor's threads end (the store stays open: it
        belongs to the caller)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.offloader.shutdown()


def _cache_mode(cache: Any) -> Literal["inline", "async", "offload"]:
    """How the async path may call ``cache`` without blocking the event loop."""
    if cache is None or getattr(cache, "is_async", False):
        return "async"
    if getattr(cache, "in_process", False):  # e.g. MemoryCache: never blocks
        return "inline"
    return "offload"


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _heartbeat_interval(value: Seconds | None, defaults: Options) -> float | None:
    if value is None:
        return None
    interval = seconds(value)
    if not 0 < interval < defaults.lease_timeout:
        raise ConfigurationError("heartbeat_interval must be positive and below lease_timeout")
    return interval


__all__ = [
    "DEFAULT_LEASE_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TTL",
    "Call",
    "Claim",
    "Engine",
]
