"""Async actors (``async def``) on the engine's native path, on Dramatiq's event loop thread.

Dramatiq runs an async actor by wrapping it (``dramatiq.asyncio.async_to_sync``): the worker
thread submits the coroutine to the event loop thread that the ``AsyncIO`` middleware starts,
and waits for it.  Wrapping *that* wrapper with the synchronous :meth:`IdempotencyHandler.run`
would make every store call on the worker thread and run the body on the loop outside the
engine's context (``current_context()`` would be ``None`` in the body).  Instead, the message
is resolved on the worker thread exactly as for a sync actor, and one coroutine —
:meth:`IdempotencyHandler.run_async` around the actor's own coroutine function — is submitted
to the loop thread: claim, body, heartbeat and outcome write run there (store calls awaited on
an async store, off-loaded on a sync one), and the outcome comes back to the worker thread,
which maps it through the same Dramatiq table as a sync actor (``MessageRun.finish``).

Time limits still work: Dramatiq interrupts the waiting worker thread, which cancels the
coroutine; the cancelled attempt is a crash for the engine (the lease decides).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dramatiq.asyncio import get_event_loop_thread

from .._core import tracing
from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from . import _state
from ._runner import MessageRun
from ._spec import ActorSpec

AsyncFn = Callable[..., Awaitable[Any]]


def coroutine_function(fn: Callable[..., Any]) -> AsyncFn | None:
    """The ``async def`` behind Dramatiq's sync bridge of an async actor, or ``None`` for a
    plain (synchronous) actor function."""
    wrapped = getattr(fn, "__wrapped__", None)
    if inspect.iscoroutinefunction(fn) or not inspect.iscoroutinefunction(wrapped):
        return None
    return wrapped


def wrap_async(
    actor: Any, spec: ActorSpec, bridge: Callable[..., Any], afn: AsyncFn,
    handler: IdempotencyHandler, default_tenant: str | None,
) -> Callable[..., Any]:
    """The actor function of an idempotent async actor (``bridge`` is Dramatiq's own sync
    wrapper, used for direct calls, which are not deduplicated)."""

    @functools.wraps(afn)
    def idempotent(*args: Any, **kwargs: Any) -> Any:
        message = _state.take_message(actor.actor_name)
        if message is None:  # a direct call (``actor(...)``), not a message: no dedup
            return bridge(*args, **kwargs)
        run = MessageRun(handler, spec, actor.broker, message, default_tenant)
        return run_on_loop(run, afn, args, kwargs)

    return idempotent


def run_on_loop(
    run: MessageRun, afn: AsyncFn, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Resolve here, run the engine on the loop thread, map the outcome here."""
    loop_thread = get_event_loop_thread()
    if loop_thread is None:
        raise ConfigurationError(
            "async actors need Dramatiq's AsyncIO middleware: "
            "broker.add_middleware(dramatiq.middleware.AsyncIO())"
        )
    spec = run.spec
    resolved = run.resolve(args, kwargs)
    # the loop's task runs in a copy of this thread's context: span and attributes included
    with tracing.messaging(run.trace_attributes):
        outcome = loop_thread.run_coroutine(run.handler.run_async(
            _body(afn, args, kwargs, spec.transactional), operation=spec.operation,
            tenant=resolved.tenant, key=resolved.key, payload=resolved.payload,
            permanent=spec.permanent, transactional=spec.transactional,
            require_key=spec.require_key,
        ))
    return run.finish(outcome)


def _body(
    afn: AsyncFn, args: tuple[Any, ...], kwargs: Mapping[str, Any], transactional: bool
) -> Callable[..., Awaitable[Any]]:
    if not transactional:
        return lambda: afn(*args, **kwargs)

    async def in_transaction(conn: Any) -> Any:
        token = _state.connection.set(conn)  # current_connection() inside the body
        try:
            return await afn(*args, **kwargs)
        finally:
            _state.connection.reset(token)

    return in_transaction


__all__ = ["coroutine_function", "run_on_loop", "wrap_async"]
