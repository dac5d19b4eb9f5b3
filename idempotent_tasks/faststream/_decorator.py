"""``@idempotent``: one subscriber made idempotent, without a broker-wide middleware.

Put it under ``@broker.subscriber(...)``.  FastStream (fast_depends) builds the subscriber's
arguments from the decorated function's signature; the wrapper keeps that signature and adds
one keyword-only parameter that FastStream fills from its context — the delivery's
``StreamMessage`` and the context itself (the subscriber, the broker) — so the body keeps
its own arguments, dependencies and body validation unchanged.  That parameter is a
``CustomField`` with an ``async`` resolver: fast_depends resolves a synchronous one (as
FastStream's own ``Context(...)``) in a worker thread, a thread hop per message.

The wrapper runs inside FastStream's call, before the result is published: a settled message
is acked by the subscriber's ack policy after its results are published (with
``AckPolicy.MANUAL`` the wrapper acks it itself, before returning).  Every other outcome is
acted on exactly as the middleware does.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fast_depends.library import CustomField
from faststream import AckPolicy

from .._core.handler import IdempotencyHandler
from ..consumers._loop import DEFAULT_RETRY_BACKOFF, OutcomeCallback
from ..consumers._resolve import KeySpec, PayloadSpec, TenantSpec
from ..typing import OnFailure, OnInProgress, OnStuck, OnSuccess, Permanent, Seconds
from ._delivery import Subscription

F = TypeVar("F", bound=Callable[..., Any])
_DELIVERY = "idempotency_delivery__"


class _Delivery(CustomField):
    """(the ``StreamMessage``, FastStream's context) of the running delivery, resolved on the
    event loop (an ``async`` ``use``: fast_depends awaits it instead of using a thread)."""

    def __init__(self) -> None:
        super().__init__(cast=False, required=True)

    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        context = kwargs["context__"]
        kwargs[self.param_name or _DELIVERY] = (context.get_local("message"), context)
        return kwargs


def idempotent(
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
) -> Callable[[F], F]:
    """Run the subscriber at most once per (tenant, operation, key); same options and
    outcome table as :class:`IdempotencyMiddleware`.

    Args:
        handler: The handler whose store records each scope; every other option is the
            middleware's (``operation``, ``key``, ``tenant``, ``dead_letter``, …).

    Returns:
        A decorator for the subscriber function, to put under ``@broker.subscriber(...)``.
    """
    subscription = Subscription(
        handler, operation=operation, tenant=tenant, default_tenant=default_tenant, key=key,
        payload=payload, permanent=permanent, require_key=require_key, ttl=ttl,
        lease_timeout=lease_timeout, max_retries=max_retries, on_stuck=on_stuck,
        on_in_progress=on_in_progress, wait_timeout=wait_timeout, on_success=on_success,
        reuse_after=reuse_after, on_failure=on_failure,
        dead_letter=dead_letter, dead_letter_options=dead_letter_options,
        retry_backoff=retry_backoff, on_outcome=on_outcome,
    )

    return functools.partial(_wrap, subscription)


def _wrap(subscription: Subscription, fn: F) -> F:
    """``fn`` as a FastStream subscriber whose every delivery goes through ``subscription``."""
    is_async = inspect.iscoroutinefunction(fn)

    @functools.wraps(fn)
    async def subscriber(*args: Any, **kwargs: Any) -> Any:
        msg, context = kwargs.pop(_DELIVERY)

        async def body() -> Any:
            if is_async:
                return await fn(*args, **kwargs)
            return await asyncio.to_thread(fn, *args, **kwargs)

        result = await subscription.process(msg, context, body)
        faststream_subscriber = context.get_local("handler_")
        if getattr(faststream_subscriber, "ack_policy", None) is AckPolicy.MANUAL:
            await msg.ack()
        return result

    subscriber.__signature__ = _with_context(fn)  # type: ignore[attr-defined]
    return subscriber  # type: ignore[return-value]


def _with_context(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature plus the keyword-only parameter FastStream fills with the delivery
    (placed before a ``**kwargs``, where keyword-only parameters must go)."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    extra = [inspect.Parameter(_DELIVERY, inspect.Parameter.KEYWORD_ONLY, default=_Delivery())]
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
        len(params),
    )
    return signature.replace(parameters=[*params[:at], *extra, *params[at:]])


__all__ = ["idempotent"]
