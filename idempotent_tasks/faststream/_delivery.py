"""One FastStream delivery through the engine, and its outcome in the broker's terms.

``Subscription.process`` resolves (tenant, key, payload) from the ``StreamMessage`` with the
consumers' conventions (:class:`~idempotent_tasks.consumers.Message` and its ``Resolver``),
awaits :meth:`IdempotencyHandler.run_async` around the subscriber's call, and maps the
outcome through the one table (docs/faststream.md):

=================  =========================================================================
kind               the message
=================  =========================================================================
executed           acked after FastStream has published the result (replies, publishers)
replayed           the same, with the stored result as the subscriber's result
in_progress        comes back later: nacked with requeue after a backoff (per broker, see
                   ``_brokers``); not counted
failed             the same (the store counted the failure); the body's error is re-raised
poisoned           dead-lettered (published to ``dead_letter`` with the ``idempotency-*``
                   headers, then acked), else dropped the broker's way; never looped
rejected           the same as poisoned
store_unavailable  the same as in_progress; the body did not run (or its outcome could not
                   be written: the lease decides once the message is back)
=================  =========================================================================

The middleware acts on the message itself before it re-raises, so FastStream's own ack policy
finds it settled and does nothing more: the table holds whatever ``ack_policy`` the subscriber
has — except ``AckPolicy.ACK_FIRST`` (and Kafka's default auto-commit), which acks before
the body runs, so nothing can bring a message back; that is logged once per subscriber.
"""

from __future__ import annotations

import asyncio
import base64
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faststream import AckPolicy
from faststream.exceptions import HandlerException

from .._core import tracing
from .._core.errors import ConfigurationError, ErrorCode, IdempotencyError, InvalidInputError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from ..consumers._loop import DEFAULT_RETRY_BACKOFF, Backoff, OutcomeCallback
from ..consumers._message import (
    DEAD_LETTER_HEADERS,
    Message,
    dead_letter_headers,
    normalize_header_name,
)
from ..consumers._resolve import (
    KeySpec,
    PayloadSpec,
    Resolved,
    Resolver,
    TenantSpec,
    is_structured_cloudevent,
)
from ..consumers._semconv import message_attributes
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Seconds
from ._brokers import Broker, broker_for

#: ``messaging.system`` of each broker adapter (``generic``: not known).
_SYSTEMS = {"rabbit": "rabbitmq", "kafka": "kafka", "confluent": "kafka", "nats": "nats",
            "redis": "redis"}

Call = Callable[[], Awaitable[Any]]
_MAX_TRACKED_ATTEMPTS = 10_000


class IdempotencyDecision(HandlerException):
    """Raised after the middleware has already acked, nacked or dead-lettered a message whose
    outcome has no result (in progress, store down, refused).  A FastStream
    ``HandlerException``: the subscriber logs it at INFO and its ack policy does nothing more.
    ``outcome`` is the engine's :class:`~idempotent_tasks.Outcome`."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome

    def __str__(self) -> str:
        code = self.outcome.error_code
        return f"idempotency: {self.outcome.kind} ({code.value if code else '-'})"


class Subscription:
    """The settings of one idempotent subscriber (or of every subscriber behind a
    middleware), and the mapping of one delivery through them."""

    def __init__(
        self,
        handler: IdempotencyHandler,
        *,
        operation: str | None = None,
        tenant: TenantSpec = None,
        default_tenant: str | None = None,
        key: KeySpec = None,
        payload: PayloadSpec = None,
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
        dead_letter: str | None = None,
        dead_letter_options: Mapping[str, Any] | None = None,
        retry_backoff: tuple[float, float] = DEFAULT_RETRY_BACKOFF,
        on_outcome: OutcomeCallback | None = None,
    ) -> None:
        self.handler = handler
        self.operation = operation
        self.key, self.tenant, self.payload = key, tenant, payload
        self.default_tenant = default_tenant
        self.permanent = permanent
        self.require_key = require_key
        self.options: dict[str, Any] = {
            "ttl": ttl, "lease_timeout": lease_timeout, "max_retries": max_retries,
            "on_stuck": on_stuck, "on_in_progress": on_in_progress,
            "wait_timeout": wait_timeout, "on_success": on_success, "reuse_after": reuse_after,
            "on_failure": on_failure,
        }
        if any(v is not None for v in self.options.values()):
            handler.defaults.merged(**self.options)  # a bad value fails here, not on a delivery
            if operation is not None:
                handler.register_operation(operation, **self.options)  # maintenance uses them
        self.dead_letter = dead_letter
        self.dead_letter_options = dict(dead_letter_options or {})
        self.backoff = Backoff(retry_backoff)
        self.on_outcome = on_outcome
        self._attempts: OrderedDict[str, int] = OrderedDict()
        self._warned: set[int] = set()

    # ------------------------------------------------------------------ one delivery
    async def process(self, msg: Any, context: Any, call: Call) -> Any:
        """Run ``call`` at most once per scope; return its (or the stored) result for
        executed / replayed, else act on the message and raise."""
        if _is_batch(msg):
            raise ConfigurationError(
                "idempotency is per message: batch subscribers are not supported (one "
                "delivery of several messages has no single key)"
            )
        subscriber = context.get_local("handler_")
        adapter = broker_for(msg)
        message = adapter.message(msg, subscriber)
        self._check_ack_policy(msg, subscriber, message)
        operation = self.operation or message.topic
        resolved = await self._resolve(msg, message, operation)
        if isinstance(resolved, IdempotencyError):
            outcome = Outcome.refused(resolved, operation=operation)
        else:
            system = _SYSTEMS.get(adapter.name)
            with tracing.messaging(lambda: message_attributes(message, system)):
                outcome = await self.handler.run_async(
                    call, operation=operation, tenant=resolved.tenant,  # type: ignore[arg-type]
                    key=resolved.key, payload=resolved.payload, permanent=self.permanent,
                    require_key=self.require_key, **self.options,
                )
        if self.on_outcome is not None:
            self.on_outcome(message, outcome)
        if outcome.settled and not outcome.dead_letter:
            self._attempts.pop(_attempt_key(message, outcome), None)
            return outcome.result
        if outcome.dead_letter:
            await self._dead_letter(adapter, msg, message, outcome, context)
        else:
            await self._retry(adapter, msg, message, outcome)
        if outcome.exception is not None and outcome.refusal is None:
            raise outcome.exception  # the body's own error: FastStream logs its traceback
        raise IdempotencyDecision(outcome)

    async def _resolve(
        self, msg: Any, message: Message, operation: str | None
    ) -> Resolved | IdempotencyError:
        payload = self.payload
        try:
            if payload is None and not is_structured_cloudevent(message):
                decoded = await _decoded(msg)
                payload = lambda _message: decoded  # noqa: E731 - the decoded body, once
            return Resolver(
                key=self.key, tenant=self.tenant, payload=payload,
                default_tenant=self.default_tenant,
            ).resolve(message)
        except IdempotencyError as err:
            self.handler.logger.warning(
                "message_rejected", operation=operation, error_code=err.code.value,
                error=err.message, topic=message.topic, offset=message.offset,
            )
            return err

    # ------------------------------------------------------------------ the table
    async def _retry(self, adapter: Broker, msg: Any, message: Message, outcome: Outcome) -> None:
        """Not now: the message comes back later (in progress, failed, store down)."""
        key = _attempt_key(message, outcome)
        attempt = self._attempts.pop(key, 0)
        self._attempts[key] = attempt + 1
        while len(self._attempts) > _MAX_TRACKED_ATTEMPTS:
            self._attempts.popitem(last=False)
        delay = self.backoff.delay(attempt)
        self.handler.logger.info(
            "message_retry_scheduled", broker=adapter.name, topic=message.topic,
            reason=outcome.kind, delay=round(delay, 3), attempt=attempt + 1,
            tenant=outcome.tenant, key=outcome.key,
            error_code=None if outcome.error_code is None else outcome.error_code.value,
        )
        try:
            await adapter.retry(msg, delay)
        except asyncio.CancelledError:
            raise  # shutting down: the unacked message comes back anyway
        except Exception as exc:
            self.handler.logger.error("message_retry_failed", broker=adapter.name, error=repr(exc))

    async def _dead_letter(
        self, adapter: Broker, msg: Any, message: Message, outcome: Outcome, context: Any
    ) -> None:
        """Poisoned or refused: publish it to ``dead_letter`` (then ack), or drop it the
        broker's way.  A dead letter that cannot be published is retried instead."""
        self._attempts.pop(_attempt_key(message, outcome), None)
        code = (outcome.error_code or ErrorCode.INTERNAL_ERROR).value
        if self.dead_letter is None:
            self.handler.logger.warning(
                "dead_letter_dropped", broker=adapter.name, topic=message.topic,
                kind=outcome.kind, error_code=code, error=outcome.error, tenant=outcome.tenant,
                key=outcome.key,
            )
            await self._settle(adapter.drop(msg), adapter)
            return
        headers = {
            k: v for k, v in message.headers.items()  # type: ignore[union-attr]
            if normalize_header_name(k) not in DEAD_LETTER_HEADERS
        }
        headers.update(dead_letter_headers(message, outcome))
        try:
            await adapter.publish(
                context.get_local("broker"), msg, self.dead_letter, headers,
                self.dead_letter_options,
            )
        except Exception as exc:
            self.handler.logger.error(
                "dead_letter_failed", broker=adapter.name, destination=self.dead_letter,
                error=repr(exc), tenant=outcome.tenant, key=outcome.key,
            )
            await self._retry(adapter, msg, message, outcome)
            return
        self.handler.logger.warning(
            "message_dead_lettered", broker=adapter.name, topic=message.topic,
            destination=self.dead_letter, kind=outcome.kind, error_code=code,
            error=outcome.error, tenant=outcome.tenant, key=outcome.key,
        )
        await self._settle(msg.ack(), adapter)

    async def _settle(self, action: Awaitable[None], adapter: Broker) -> None:
        """Ack / reject / term: a failure is logged (the broker redelivers what it did not
        get, and the redelivery finds the store's verdict)."""
        try:
            await action
        except Exception as exc:
            self.handler.logger.error("message_settle_failed", broker=adapter.name, error=repr(exc))

    def _check_ack_policy(self, msg: Any, subscriber: Any, message: Message) -> None:
        """A message acked before its body ran cannot come back: say so, once."""
        acks_first = getattr(subscriber, "ack_policy", None) is AckPolicy.ACK_FIRST
        if (msg.committed is None and not acks_first) or id(subscriber) in self._warned:
            return
        self._warned.add(id(subscriber))
        self.handler.logger.warning(
            "faststream_message_acked_before_processing", topic=message.topic,
            hint="use ack_policy=AckPolicy.REJECT_ON_ERROR (or ACK / MANUAL): with "
                 "ACK_FIRST or Kafka auto-commit a retried or crashed message is lost",
        )


def _is_batch(msg: Any) -> bool:
    raw = msg.raw_message
    if isinstance(raw, list | tuple):
        return True  # Kafka and NATS batches
    return isinstance(raw, dict) and raw.get("type") in ("bstream", "blist")  # Redis


async def _decoded(msg: Any) -> Any:
    """The body as FastStream decodes it (cached: the subscriber reuses it), as the payload;
    a body FastStream left as bytes is hashed as its base64 text (the canonical JSON of a
    payload has no bytes).  A body that cannot be decoded is invalid input."""
    try:
        decoded = await msg.decode()
    except Exception as exc:
        raise InvalidInputError(
            f"the message body cannot be decoded: {type(exc).__name__}",
            code=ErrorCode.INVALID_PAYLOAD,
        ) from exc
    if isinstance(decoded, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(decoded)).decode("ascii")
    return decoded


def _attempt_key(message: Message, outcome: Outcome) -> str:
    if outcome.key is not None:
        return f"{outcome.tenant}\x00{outcome.key}"
    return f"{message.topic}\x00{message.message_id}\x00{message.offset}"


__all__ = ["IdempotencyDecision", "Subscription"]
