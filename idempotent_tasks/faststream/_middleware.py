"""The FastStream middleware: every subscriber of a broker (or router) becomes idempotent.

FastStream builds one middleware object per delivery from the factory given to
``Broker(middlewares=[...])`` / ``Router(middlewares=[...])``.  Its ``consume_scope`` wraps
the subscriber's call (decoding included) in :meth:`IdempotencyHandler.run_async`; its exit
acks a settled message *after* FastStream has published the result to ``reply_to`` and the
subscriber's publishers, so that a crash in between brings the message back (it is then
replayed and the result published again: results are published at least once).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from faststream import BaseMiddleware

from .._core.handler import IdempotencyHandler
from ..consumers._loop import DEFAULT_RETRY_BACKOFF, OutcomeCallback
from ..consumers._resolve import KeySpec, PayloadSpec, TenantSpec
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Seconds
from ._delivery import Subscription


class IdempotencyMiddleware:
    """Exactly-once effects per (tenant, operation, key) for every subscriber it covers.

    ``operation`` defaults to the delivery's destination (the queue, subject, stream or
    topic).  Key, tenant and payload follow the consumers' conventions (docs/consumers.md):
    the ``idempotency-key`` header, else the CloudEvents source + id (``key="coordinates"``
    opts in to the broker's coordinates); the ``idempotency-tenant`` header, else
    ``default_tenant``; the payload is the decoded message body.  ``dead_letter`` names
    where poisoned and refused messages are published (a queue, subject, stream or topic of
    the same broker, with ``dead_letter_options`` passed to ``broker.publish``); without it
    they are dropped the broker's way (RabbitMQ: ``reject`` to the queue's DLX).
    """

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
        self.subscription = Subscription(
            handler, operation=operation, tenant=tenant, default_tenant=default_tenant,
            key=key, payload=payload, permanent=permanent, require_key=require_key, ttl=ttl,
            lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
            on_in_progress=on_in_progress, wait_timeout=wait_timeout, on_success=on_success,
            reuse_after=reuse_after, on_failure=on_failure,
            dead_letter=dead_letter, dead_letter_options=dead_letter_options,
            retry_backoff=retry_backoff, on_outcome=on_outcome,
        )

    def __call__(self, msg: Any, /, *, context: Any) -> _Scope:
        """FastStream's middleware factory protocol: one scope per delivery."""
        return _Scope(msg, context=context, subscription=self.subscription)


class _Scope(BaseMiddleware):
    """One delivery: the engine around the subscriber's call, the ack after its results."""

    __slots__ = ("message", "settled", "subscription")

    def __init__(self, msg: Any, /, *, context: Any, subscription: Subscription) -> None:
        super().__init__(msg, context=context)
        self.subscription = subscription
        self.message: Any = None
        self.settled = False

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        self.message = msg
        result = await self.subscription.process(msg, self.context, lambda: call_next(msg))
        self.settled = True
        return result

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        if self.settled and exc_type is None and self.message is not None:
            try:
                await self.message.ack()
            except Exception as exc:  # the broker logs too; the message comes back and replays
                self.subscription.handler.logger.error("message_ack_failed", error=repr(exc))
        return False


__all__ = ["IdempotencyMiddleware"]
