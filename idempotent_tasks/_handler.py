"""The execution algorithm (DESIGN.md §2): validate, claim, decide, run, record.

The handler owns every decision; stores only execute atomic conditional writes.  It knows
nothing about Celery, Dramatiq, brokers, SQL or Redis.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import Token
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, TypeVar

from ._context import CURRENT_CONTEXT
from ._errors import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    InvalidInputError,
    OutcomeNotRecordedError,
    StoreUnavailableError,
    make_error,
)
from ._heartbeat import HeartbeatThread, Lease
from ._logging import Logger, default_logger
from ._metrics import Metrics, NoMetrics, default_metrics
from ._records import IdempotencyContext, LazyCountContext, Record, Scope, Status, StoredRecord
from ._scope import validate_key, validate_operation, validate_tenant
from ._serialization import DEFAULT_SERIALIZER, SerializationError, Serializer, request_hash
from .caches.base import Cache
from .stores.base import Store, SuccessWrite

T = TypeVar("T")

DEFAULT_TTL = 86_400.0
DEFAULT_LEASE_TIMEOUT = 300.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_OUTCOME_RETRY_TIMEOUT = 30.0
_MAX_CLAIM_ROUNDS = 8
_MAX_ACCEPTED = 4096  # distinct tenants/operations remembered as valid

OnStuck = Literal["retry", "fail"]
Seconds = float | dt.timedelta
Permanent = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


def seconds(value: Seconds) -> float:
    """Durations are seconds everywhere; a ``timedelta`` is accepted too."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return float(value)


def new_token() -> int:
    """A fencing token: a random 62-bit positive integer, unique per attempt."""
    return secrets.randbits(62) + 1


@dataclass(frozen=True, slots=True)
class Options:
    """Per-operation settings; precedence: call site > registered operation > handler."""

    ttl: float
    lease_timeout: float
    max_retries: int
    on_stuck: OnStuck

    def merged(
        self,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> Options:
        changes: dict[str, Any] = {}
        if ttl is not None:
            changes["ttl"] = seconds(ttl)
        if lease_timeout is not None:
            changes["lease_timeout"] = seconds(lease_timeout)
        if max_retries is not None:
            changes["max_retries"] = max_retries
        if on_stuck is not None:
            changes["on_stuck"] = on_stuck
        if not changes:
            return self
        merged = replace(self, **changes)
        merged.validate()
        return merged

    def validate(self) -> None:
        if self.ttl <= 0 or self.lease_timeout <= 0:
            raise ConfigurationError("ttl and lease_timeout must be positive")
        if self.max_retries < 1:
            raise ConfigurationError("max_retries must be at least 1")
        if self.on_stuck not in ("retry", "fail"):
            raise ConfigurationError("on_stuck must be 'retry' or 'fail'")


@dataclass(slots=True)
class Call:
    """One validated delivery."""

    scope: Scope
    request_hash: str
    options: Options

    def fields(self) -> dict[str, str]:
        s = self.scope
        return {"tenant": s.tenant, "operation": s.operation, "key": s.key}

    def error(self, code: ErrorCode, message: str) -> IdempotencyError:
        s = self.scope
        return make_error(code, message, tenant=s.tenant, operation=s.operation, key=s.key)


@dataclass(slots=True)
class Claim:
    """The result of the claim phase: either we own the scope, or a replayed value."""

    token: int | None
    retry_count: int
    replay: Any = None
    #: False for a fresh claim: the scope's counter was not read (see ``LazyCountContext``).
    counted: bool = True

    @property
    def owned(self) -> bool:
        return self.token is not None


class IdempotencyHandler:
    """Runs bodies at most once per scope; see DESIGN.md §2 for the algorithm."""

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
    ) -> None:
        self.store = store
        self.cache = cache
        self.defaults = Options(seconds(ttl), seconds(lease_timeout), max_retries, on_stuck)
        self.defaults.validate()
        self.heartbeat_interval = (
            None if heartbeat_interval is None else seconds(heartbeat_interval)
        )
        if self.heartbeat_interval is not None and not (
            0 < self.heartbeat_interval < self.defaults.lease_timeout
        ):
            raise ConfigurationError("heartbeat_interval must be positive and below lease_timeout")
        self.log: Logger = logger if logger is not None else default_logger()
        self.metrics: Metrics = (
            default_metrics() if metrics == "auto" else (metrics or NoMetrics())
        )
        self.clock = clock
        self.serializer: Serializer = serializer or DEFAULT_SERIALIZER
        self.max_payload_bytes = max_payload_bytes
        self.max_response_bytes = max_response_bytes
        self.outcome_retry_timeout = seconds(outcome_retry_timeout)
        self._operations: dict[str, Options] = {}
        self._accepted: dict[str, str] = {}
        self._heartbeat = (
            HeartbeatThread(self.heartbeat_interval, self._renew)
            if self.heartbeat_interval is not None
            else None
        )

    # ------------------------------------------------------------------ configuration
    def register_operation(
        self,
        operation: str,
        *,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> None:
        """Per-operation defaults (what a task decorator declares); recovery uses them too."""
        self._operations[operation] = self.defaults.merged(
            ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck
        )

    def options_for(self, operation: str) -> Options:
        return self._operations.get(operation, self.defaults)

    # ------------------------------------------------------------------ public API
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
        """Run ``fn`` at most once per scope; replay, refuse or wait otherwise (§2)."""
        call = self.prepare(
            operation, tenant, key, payload, require_key, ttl, lease_timeout, max_retries,
            on_stuck,
        )
        if call is None:
            return self._run_unkeyed(fn, operation)
        claim = self.claim(call)
        if not claim.owned:
            replayed: T = claim.replay
            return replayed
        done: T = self.run_claimed(call, claim, fn, permanent)
        return done

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
        """The same contract for coroutines; store calls run off the event loop."""
        call = self.prepare(
            operation, tenant, key, payload, require_key, ttl, lease_timeout, max_retries,
            on_stuck,
        )
        if call is None:
            self._unkeyed(operation)
            return await afn()
        claim = await asyncio.to_thread(self.claim, call)
        if not claim.owned:
            replayed: T = claim.replay
            return replayed
        assert claim.token is not None
        with self._running(call, claim):
            try:
                result = await afn()
            except BaseException as exc:
                await asyncio.to_thread(self.on_body_error, call, claim.token, exc, permanent)
                raise
        done: T = await asyncio.to_thread(self.complete, call, claim.token, result)
        return done

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
        """Run ``fn(conn)`` in one transaction that also commits SUCCESS (§2b)."""
        from ._transactional import run_in_transaction

        return run_in_transaction(
            self, fn, operation=operation, tenant=tenant, key=key, payload=payload,
            permanent=permanent, require_key=require_key, ttl=ttl, lease_timeout=lease_timeout,
            max_retries=max_retries, on_stuck=on_stuck,
        )

    def get_record(self, *, operation: str, tenant: str, key: str) -> Record | None:
        """The live record of a scope (an expired one counts as absent), counter included."""
        scope = Scope(
            validate_tenant(tenant), validate_operation(operation), validate_key(key)
        )
        stored = self.store_call("get", self.store.get, scope)
        if stored is None or self._expired(stored, self.clock()):
            return None
        count = self.store_call("get_retry_count", self.store.get_retry_count, scope)
        return self.to_record(stored, count)

    def recover_stuck_records(self, timeout: Seconds | None = None, limit: int = 100) -> int:
        """Handle PROCESSING records whose lease expired (and, with ``timeout``, whose last
        heartbeat is older than it): count the crashed attempt and release or poison
        (``on_stuck="retry"``), or poison (``"fail"``).  Returns the records handled."""
        from ._maintenance import recover

        return recover(self, None if timeout is None else seconds(timeout), limit)

    def cleanup_expired_records(self, limit: int = 500) -> int:
        """Purge expired SUCCESS/FAILED records and stale counters; returns records purged."""
        from ._maintenance import cleanup

        return cleanup(self, limit)

    def unpoison(self, *, operation: str, tenant: str, key: str, actor: str = "operator") -> Record:
        """Delete a FAILED record and reset its counter (audited); RECORD_NOT_FOUND if absent."""
        from ._maintenance import unpoison

        return unpoison(self, operation=operation, tenant=tenant, key=key, actor=actor)

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    # ------------------------------------------------------------------ phase 1: validate
    def prepare(
        self,
        operation: str,
        tenant: str | None,
        key: str | None,
        payload: Any,
        require_key: bool,
        ttl: Seconds | None = None,
        lease_timeout: Seconds | None = None,
        max_retries: int | None = None,
        on_stuck: OnStuck | None = None,
    ) -> Call | None:
        """Validate and hash; ``None`` means "run unkeyed" (no key, ``require_key=False``)."""
        op = self._validated(operation, validate_operation)
        if (key is None or key == "") and not require_key:
            return None
        k = validate_key(key)
        t = self._validated(tenant, validate_tenant)
        scope = Scope(t, op, k)
        options = self.options_for(op).merged(
            ttl=ttl, lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck
        )
        return Call(scope, self.hash_payload(scope, payload), options)

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

    def hash_payload(self, scope: Scope, payload: Any) -> str:
        try:
            encoded = self.serializer.dumps(payload)
        except (SerializationError, TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"payload is not serialisable: {exc}",
                code=ErrorCode.INVALID_PAYLOAD,
                tenant=scope.tenant, operation=scope.operation, key=scope.key,
            ) from exc
        if len(encoded) > self.max_payload_bytes:
            raise InvalidInputError(
                f"payload is larger than {self.max_payload_bytes} bytes",
                code=ErrorCode.INVALID_PAYLOAD,
                tenant=scope.tenant, operation=scope.operation, key=scope.key,
            )
        return request_hash(encoded)

    # ------------------------------------------------------------------ phase 2: claim
    def claim(self, call: Call) -> Claim:
        """Own the scope (``Claim.token``) or get the replay; raises for every refusal."""
        cached = self._cache_get(call)
        if cached is not None:
            return cached
        for _ in range(_MAX_CLAIM_ROUNDS):
            now = self.clock()
            token = new_token()
            result = self.store_call(
                "create", self.store.create, call.scope, request_hash=call.request_hash,
                token=token, now=now, lease_expires_at=now + call.options.lease_timeout,
            )
            if result.created:
                return Claim(token, 0, counted=False)
            claim = self.decide_duplicate(call, result.record)
            if claim is not None:
                return claim
        raise call.error(ErrorCode.REQUEST_IN_PROGRESS, "the scope changed hands repeatedly")

    def decide_duplicate(self, call: Call, record: StoredRecord | None) -> Claim | None:
        """Decide for an existing record (§2.4): a replay ``Claim``, a takeover ``Claim`` we
        own, or an ``IdempotencyError``; ``None`` means "it changed meanwhile: claim again".
        Public for integrations that claim in bulk (``Store.create_many``)."""
        if record is None:
            return None
        fields = call.fields()
        self.metrics.duplicate(call.scope.operation, record.status.value)
        if record.request_hash != call.request_hash:
            self.log.warning("key_reused", status=record.status.value, **fields)
            raise call.error(
                ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST,
                "this idempotency key was used with a different payload",
            )
        if record.status is Status.SUCCESS:
            value = self._decode(call, record)
            self._cache_set(call, record)
            self.log.debug("duplicate_replayed", status="SUCCESS", **fields)
            return Claim(None, 0, value)
        if record.status is Status.FAILED:
            self.log.warning("duplicate_poisoned", status="FAILED", **fields)
            raise call.error(ErrorCode.REQUEST_FAILED, "this scope is poisoned (FAILED)")
        now = self.clock()
        if record.lease_expires_at is not None and record.lease_expires_at > now:
            self.log.info("duplicate_in_progress", status="PROCESSING", **fields)
            raise call.error(ErrorCode.REQUEST_IN_PROGRESS, "the first delivery is still running")
        return self._on_expired_lease(call, record, now)

    def _on_expired_lease(self, call: Call, record: StoredRecord, now: float) -> Claim | None:
        fields = call.fields()
        opts = call.options
        if opts.on_stuck == "fail":
            if self.store_call(
                "mark_failed", self.store.mark_failed, call.scope, token=record.fencing_token,
                now=now, expires_at=now + opts.ttl, only_if_lease_expired=True,
            ):
                self.metrics.poisoned(call.scope.operation)
                self.log.warning("crashed_attempt_poisoned", status="FAILED", **fields)
                raise call.error(ErrorCode.REQUEST_FAILED, "a crashed attempt poisoned the scope")
            return self._reread(call)
        token = new_token()
        count = self.store_call(
            "take_over", self.store.take_over, call.scope, expected_token=record.fencing_token,
            new_token=token, now=now, lease_expires_at=now + opts.lease_timeout,
        )
        if count is None:
            return self._reread(call)
        if count >= opts.max_retries:
            self._write_outcome(
                call, "mark_failed", self.store.mark_failed, call.scope, token=token,
                now=now, expires_at=now + opts.ttl,
            )
            self.metrics.poisoned(call.scope.operation)
            self.log.warning(
                "taken_over_and_poisoned", status="FAILED", retry_count=count, **fields
            )
            raise call.error(ErrorCode.REQUEST_FAILED, "retries exhausted by crashed attempts")
        self.log.info("taken_over", status="PROCESSING", retry_count=count, **fields)
        return Claim(token, count)

    def _reread(self, call: Call) -> Claim | None:
        record = self.store_call("get", self.store.get, call.scope)
        if record is None or self._expired(record, self.clock()):
            return None
        return self.decide_duplicate(call, record)

    # ------------------------------------------------------------------ phase 3: run
    def run_claimed(
        self,
        call: Call,
        claim: Claim,
        fn: Callable[..., T],
        permanent: Permanent = (),
        *,
        transactional: bool = False,
    ) -> T:
        """Run the body of a scope we own and record its outcome (what ``execute`` does after
        ``claim``): ``fn()``, or ``fn(conn)`` inside the store's transaction (§2b)."""
        assert claim.token is not None, "run_claimed needs an owned claim"
        if transactional:
            from ._transactional import run_owned_in_transaction

            with self._running(call, claim):
                return run_owned_in_transaction(self, call, claim.token, fn, permanent)
        result = self.run_body(call, claim, fn, permanent)
        done: T = self.complete(call, claim.token, result)
        return done

    def run_body(
        self, call: Call, claim: Claim, fn: Callable[[], T], permanent: Permanent = ()
    ) -> T:
        """Only the body of a scope we own: a failure is recorded (``on_body_error``) and
        re-raised; a result is returned *unrecorded* — for ``complete`` or, for a batch,
        ``complete_many``."""
        assert claim.token is not None, "run_body needs an owned claim"
        with self._running(call, claim):
            try:
                return fn()
            except BaseException as exc:
                self.on_body_error(call, claim.token, exc, permanent)
                raise

    def _running(self, call: Call, claim: Claim) -> _Running:
        """Bind the context, and keep the lease alive while the body runs (if configured)."""
        return _Running(self, call, claim)

    def _read_count(self, scope: Scope) -> int:
        try:
            count: int = self.store_call("get_retry_count", self.store.get_retry_count, scope)
        except StoreUnavailableError:
            return 0  # logged and counted by store_call; the context is informational
        return count

    def _renew(self, lease: Lease) -> bool:
        now = self.clock()
        try:
            ok = self.store_call(
                "heartbeat", self.store.heartbeat, lease.scope, token=lease.token, now=now,
                lease_expires_at=now + lease.lease_timeout,
            )
        except StoreUnavailableError:
            return True  # keep trying; the lease decides if the store stays away
        if not ok:
            s = lease.scope
            self.log.warning("heartbeat_refused", tenant=s.tenant, operation=s.operation, key=s.key)
        return ok

    def _run_unkeyed(self, fn: Callable[[], T], operation: str) -> T:
        self._unkeyed(operation)
        return fn()

    def _unkeyed(self, operation: str) -> None:
        self.metrics.execution(operation, "unkeyed")
        self.log.info("executed_unkeyed", operation=operation, status="UNKEYED")

    # ------------------------------------------------------------------ phase 4: record
    def encode_response(self, call: Call, token: int, result: Any) -> bytes:
        """Serialise the body's result; on failure the scope is poisoned (it already ran)."""
        try:
            encoded = self.serializer.dumps(result)
            if len(encoded) > self.max_response_bytes:
                raise SerializationError(f"result is larger than {self.max_response_bytes} bytes")
        except (SerializationError, TypeError, ValueError) as exc:
            self.poison(call, token, reason="response_not_serializable")
            raise call.error(
                ErrorCode.RESPONSE_NOT_SERIALIZABLE, f"the task's result cannot be stored: {exc}"
            ) from exc
        return encoded

    def complete(self, call: Call, token: int, result: Any) -> Any:
        encoded = self.encode_response(call, token, result)
        now = self.clock()
        stored = self._write_outcome(
            call, "mark_success", self.store.mark_success, call.scope, token=token,
            response=encoded, now=now, expires_at=now + call.options.ttl,
        )
        return self._completed(call, encoded, stored, now)

    def complete_many(
        self, done: Sequence[tuple[Call, int, Any]]
    ) -> list[Any | IdempotencyError]:
        """``complete`` for several owned scopes (distinct), their SUCCESS records written in
        one store round trip (``Store.mark_success_many``).  Per item, in order: the value
        ``complete`` would return, or the ``IdempotencyError`` it would raise."""
        out: list[Any] = []
        written: list[tuple[int, Call, SuccessWrite]] = []  # (position in out, call, write)
        now = self.clock()
        for call, token, result in done:
            try:
                enc = self.encode_response(call, token, result)
            except IdempotencyError as err:  # poisoned by encode_response
                out.append(err)
                continue
            write = SuccessWrite(call.scope, token, enc, now + call.options.ttl)
            written.append((len(out), call, write))
            out.append(None)
        if not written:
            return out
        try:
            stored = self._write_outcome(
                written[0][1], "mark_success_many", self.store.mark_success_many,
                [w for _, _, w in written], now=now,
            )
        except IdempotencyError as err:  # OUTCOME_NOT_RECORDED: the whole write failed
            for i, call, _ in written:
                out[i] = call.error(err.code, err.message)
            return out
        for (i, call, w), ok in zip(written, stored, strict=True):
            out[i] = self._completed(call, w.response, ok, now)
        return out

    def _completed(self, call: Call, encoded: bytes, stored: bool, now: float) -> Any:
        """After the SUCCESS write: the replayable value, metrics, log and cache."""
        value = self.serializer.loads(encoded)
        if not stored and not self._adopt_success(call, encoded):
            self.lease_lost(call)
            return value
        self.metrics.execution(call.scope.operation, "success")
        self.log.debug("executed", status="SUCCESS", **call.fields())
        if self.cache is not None:
            self._cache_put(call, encoded, now + call.options.ttl)
        return value

    def _adopt_success(self, call: Call, encoded: bytes) -> bool:
        """Our SUCCESS write was refused.  If no attempt owns the scope any more — recovery
        released it while we were paused past our lease — the body that really ran is ours:
        claim the scope afresh and record its outcome, so that no redelivery runs it again.
        If another attempt holds it (a takeover), we are truly stale: write nothing."""
        now = self.clock()
        token = new_token()
        claimed = self._write_outcome(
            call, "create", self.store.create, call.scope, request_hash=call.request_hash,
            token=token, now=now, lease_expires_at=now + call.options.lease_timeout,
        )
        if not claimed.created:
            return False
        stored: bool = self._write_outcome(
            call, "mark_success", self.store.mark_success, call.scope, token=token,
            response=encoded, now=now, expires_at=now + call.options.ttl,
        )
        if stored:
            self.log.warning("released_scope_adopted", status="SUCCESS", **call.fields())
        return stored

    def on_body_error(
        self, call: Call, token: int, exc: BaseException, permanent: Permanent
    ) -> Literal["poisoned", "released", "lease_lost"]:
        """Permanent → poison; transient → count, then release or poison (§2.5).  Returns
        what was recorded (``"lease_lost"``: nothing, another attempt owns the scope)."""
        if is_permanent(exc, permanent):
            self.metrics.execution(call.scope.operation, "permanent_failure")
            ok = self.poison(call, token, reason="permanent_failure", error=type(exc).__name__)
            return "poisoned" if ok else "lease_lost"
        self.metrics.execution(call.scope.operation, "transient_failure")
        now = self.clock()
        result = self._write_outcome(
            call, "record_failure", self.store.record_failure, call.scope, token=token,
            now=now, max_retries=call.options.max_retries, expires_at=now + call.options.ttl,
            cause=exc,
        )
        if result is None:
            self.lease_lost(call)
            return "lease_lost"
        if result.poisoned:
            self.metrics.poisoned(call.scope.operation)
            self.log.warning(
                "poisoned", status="FAILED", reason="retries_exhausted",
                retry_count=result.retry_count, error=type(exc).__name__, **call.fields(),
            )
            return "poisoned"
        self.log.info(
            "released_for_retry", status="RELEASED", retry_count=result.retry_count,
            error=type(exc).__name__, **call.fields(),
        )
        return "released"

    def poison(self, call: Call, token: int, *, reason: str, error: str | None = None) -> bool:
        now = self.clock()
        ok = self._write_outcome(
            call, "mark_failed", self.store.mark_failed, call.scope, token=token, now=now,
            expires_at=now + call.options.ttl,
        )
        if not ok:
            self.lease_lost(call)
            return False
        self.metrics.poisoned(call.scope.operation)
        self.log.warning("poisoned", status="FAILED", reason=reason, error=error, **call.fields())
        return True

    def lease_lost(self, call: Call) -> None:
        self.metrics.lease_lost(call.scope.operation)
        self.log.warning("lease_lost", status="PROCESSING", **call.fields())

    def _write_outcome(
        self,
        call: Call,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        cause: BaseException | None = None,
        **kwargs: Any,
    ) -> T:
        """Write after the body ran: retried with bounded backoff, then OUTCOME_NOT_RECORDED."""
        deadline = time.monotonic() + self.outcome_retry_timeout
        delay = 0.05
        while True:
            try:
                return self.store_call(name, fn, *args, **kwargs)
            except StoreUnavailableError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.log.error("outcome_not_recorded", call=name, **call.fields())
                    err = call.error(
                        ErrorCode.OUTCOME_NOT_RECORDED,
                        f"the body ran but its outcome could not be written: {exc.message}",
                    )
                    raise err from (cause or exc)
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------------ helpers
    def store_call(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Every store call: timed, errors counted and translated (fail closed)."""
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except StoreUnavailableError as exc:
            self.metrics.store_error(self.store.name)
            self.log.error(
                "store_unavailable", call=name, store=self.store.name, error=exc.message,
                **_scope_fields(args),
            )
            raise
        except IdempotencyError:
            raise
        except Exception as exc:
            self.metrics.store_error(self.store.name)
            self.log.error(
                "store_error", call=name, store=self.store.name, error=repr(exc),
                **_scope_fields(args),
            )
            raise StoreUnavailableError(f"store call {name} failed: {exc!r}") from exc
        finally:
            self.metrics.store_latency(self.store.name, name, time.perf_counter() - started)

    def _expired(self, record: StoredRecord, now: float) -> bool:
        return record.expires_at is not None and record.expires_at <= now

    def _decode(self, call: Call, record: StoredRecord) -> Any:
        if record.response is None:
            return None
        try:
            return self.serializer.loads(record.response)
        except SerializationError as exc:
            raise call.error(ErrorCode.INTERNAL_ERROR, "stored response cannot be decoded") from exc

    def to_record(self, stored: StoredRecord, retry_count: int) -> Record:
        response = None
        if stored.response is not None:
            try:
                response = self.serializer.loads(stored.response)
            except SerializationError:
                response = None
        s = stored.scope
        return Record(
            tenant=s.tenant, operation=s.operation, key=s.key, status=stored.status,
            request_hash=stored.request_hash, response=response, retry_count=retry_count,
            fencing_token=stored.fencing_token, created_at=stored.created_at,
            updated_at=stored.updated_at, lease_expires_at=stored.lease_expires_at,
            expires_at=stored.expires_at,
        )

    # ------------------------------------------------------------------ cache
    def _cache_key(self, scope: Scope) -> str:
        return scope.encoded()

    def _cache_get(self, call: Call) -> Claim | None:
        if self.cache is None:
            return None
        try:
            entry = self.cache.get(self._cache_key(call.scope))
        except Exception as exc:
            self._cache_failed("get", exc)
            return None
        if entry is None:
            return None
        return self._cache_replay(call, entry)

    def _cache_replay(self, call: Call, entry: bytes) -> Claim | None:
        stored_hash, _, body = entry.partition(b"\n")
        if len(stored_hash) != 64:
            return None
        if stored_hash.decode("ascii", "replace") != call.request_hash:
            return None  # let the store decide (and answer KEY_REUSED) — it is the truth
        try:
            value = self.serializer.loads(body)
        except SerializationError:
            return None
        self.metrics.cache_hit(call.scope.operation)
        self.metrics.duplicate(call.scope.operation, Status.SUCCESS.value)
        self.log.debug("duplicate_replayed", status="SUCCESS", source="cache", **call.fields())
        return Claim(None, 0, value)

    def _cache_set(self, call: Call, record: StoredRecord) -> None:
        if self.cache is not None and record.response is not None and record.expires_at:
            self._cache_put(call, record.response, record.expires_at)

    def _cache_put(self, call: Call, encoded: bytes, expires_at: float) -> None:
        assert self.cache is not None
        ttl = expires_at - self.clock()
        if ttl <= 0:
            return
        try:
            self.cache.set(
                self._cache_key(call.scope), call.request_hash.encode() + b"\n" + encoded, ttl
            )
        except Exception as exc:
            self._cache_failed("set", exc)

    def _cache_failed(self, op: str, exc: Exception) -> None:
        name = getattr(self.cache, "name", "cache")
        self.metrics.cache_error(name)
        self.log.warning("cache_unavailable", cache=name, call=op, error=repr(exc))


class _Running:
    """The body's surroundings (``with handler._running(call, claim):``): its context bound,
    its lease registered with the heartbeat thread.  A slotted class rather than a generator
    context manager: it is entered on every execution."""

    __slots__ = ("_call", "_claim", "_handler", "_ident", "_reset")

    def __init__(self, handler: IdempotencyHandler, call: Call, claim: Claim) -> None:
        self._handler = handler
        self._call = call
        self._claim = claim
        self._ident: int | None = None
        self._reset: Token[IdempotencyContext | None] | None = None

    def __enter__(self) -> None:
        call, claim, handler = self._call, self._claim, self._handler
        token = claim.token
        assert token is not None
        scope = call.scope
        ctx = LazyCountContext(
            scope.tenant, scope.operation, scope.key, call.request_hash, "executing",
            claim.retry_count, token,
            load=None if claim.counted else partial(handler._read_count, scope),
        )
        heartbeat = handler._heartbeat
        if heartbeat is not None:
            self._ident = heartbeat.register(Lease(scope, token, call.options.lease_timeout))
        self._reset = CURRENT_CONTEXT.set(ctx)

    def __exit__(self, *_: object) -> None:
        if self._reset is not None:
            CURRENT_CONTEXT.reset(self._reset)
        heartbeat = self._handler._heartbeat
        if self._ident is not None and heartbeat is not None:
            heartbeat.unregister(self._ident)


def _scope_fields(args: tuple[Any, ...]) -> dict[str, str]:
    """The scope of a store call, for its error log line (maintenance calls have none)."""
    if args and isinstance(args[0], Scope):
        s = args[0]
        return {"tenant": s.tenant, "operation": s.operation, "key": s.key, "status": "UNKNOWN"}
    return {}


def is_permanent(exc: BaseException, permanent: Permanent) -> bool:
    if isinstance(exc, IdempotencyError) and exc.code is ErrorCode.CONFIGURATION_ERROR:
        return True
    if callable(permanent) and not isinstance(permanent, tuple):
        return bool(permanent(exc))
    return bool(permanent) and isinstance(exc, permanent)


__all__ = ["Call", "Claim", "IdempotencyHandler", "Options", "OutcomeNotRecordedError"]
