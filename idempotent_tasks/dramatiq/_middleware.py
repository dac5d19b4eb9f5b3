"""The Dramatiq middleware: wraps idempotent actors, maps outcomes, runs maintenance."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware, MiddlewareError, Retries

from .._core.handler import IdempotencyHandler
from .._core.runner import CLEANUP_EVERY, RECOVER_EVERY, MaintenanceRunner, MaintenanceSchedule
from ..typing import Seconds, seconds
from . import _state
from ._asyncio import coroutine_function, wrap_async
from ._retry_guard import RetryGuard, enable_publisher_confirms
from ._runner import MessageRun
from ._skip_log import install_replay_skip_filter
from ._spec import ACTOR_OPTIONS, ActorSpec
from ._unique import UniqueActor, UniqueRelease

_MARKER = "__idempotency_middleware__"
_FALLBACK_MAX_RETRIES = 20  # Dramatiq's own default, for exceptions we did not decide
_NOT_UNIQUE = (
    "{}: unique=True is honoured by send / send_with_options of a UniqueActor "
    "(dramatiq.actor(actor_class=idempotent_tasks.dramatiq.UniqueActor, ...)); this message "
    "would be enqueued as if it were not unique"
)


class IdempotencyMiddlewareError(MiddlewareError):
    """A setup problem that must stop the message or the worker (a ``MiddlewareError``,
    so Dramatiq does not log-and-continue): the broker has no Retries middleware, an
    idempotent actor was not wrapped by this middleware, or ``unique=True`` reached an actor or
    a message that would silently ignore it (not a :class:`UniqueActor`'s ``send``)."""


RetryWhen = Callable[[int, BaseException], bool]


class IdempotencyMiddleware(Middleware):
    """Exactly-once execution per (tenant, operation, key) for actors declared with
    ``idempotent=True`` (what :func:`idempotent_actor` does).

    Add it to the broker *before* declaring actors (Dramatiq validates actor options at
    declaration).  ``default_tenant`` declares a single-tenant app; without it a message with
    no tenant is refused (``MISSING_TENANT``).  With ``maintenance=True`` every worker
    process runs ``recover_stuck_records`` every ``recover_every`` seconds and
    ``cleanup_expired_records`` every ``cleanup_every`` seconds in a daemon thread; a lease in
    the store lets only one worker of the fleet run each job at a time.

    The original of a failed message is acked only once its retry is enqueued (a RabbitMQ
    broker gets publisher confirms when the worker boots): see ``_retry_guard``.
    """

    def __init__(
        self,
        handler: IdempotencyHandler,
        *,
        default_tenant: str | None = None,
        maintenance: bool = True,
        recover_every: Seconds = RECOVER_EVERY,
        cleanup_every: Seconds = CLEANUP_EVERY,
    ) -> None:
        self.handler = handler
        self.default_tenant = default_tenant
        self.maintenance = maintenance
        self.maintenance_runner = MaintenanceRunner(
            handler,
            MaintenanceSchedule(recover_every=seconds(recover_every),
                                cleanup_every=seconds(cleanup_every)),
        )
        self.retry_guard = RetryGuard(handler.logger)
        self.unique = UniqueRelease(handler)  # the marks of ``enqueue_unique``, every actor
        self._workers = 0
        self._lock = threading.Lock()

    @property
    def actor_options(self) -> set[str]:
        return set(ACTOR_OPTIONS)

    # ------------------------------------------------------------------ declaration
    def before_declare_actor(
        self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]
    ) -> None:
        if actor.options.get("unique") and not isinstance(actor, UniqueActor):
            raise IdempotencyMiddlewareError(_NOT_UNIQUE.format(actor.actor_name))

    def after_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        if not actor.options.get("idempotent") or getattr(actor.fn, _MARKER, None) is self:
            return
        spec = ActorSpec.from_options(actor.actor_name, actor.options)
        if spec.overrides:
            self.handler.register_operation(spec.operation, **spec.overrides)
        if spec.transactional and not self.handler.supports_transactions:
            self.handler.logger.warning(
                "dramatiq_transactional_needs_sql_store", operation=spec.operation
            )
        actor.options["retry_when"] = _retry_policy(broker, actor.options.get("retry_when"))
        actor.fn = self._wrap(actor, spec)

    def _wrap(self, actor: dramatiq.Actor[Any, Any], spec: ActorSpec) -> Callable[..., Any]:
        fn = actor.fn
        afn = coroutine_function(fn)
        if afn is not None:  # an async actor: the engine's native path on the loop (_asyncio)
            wrapped = wrap_async(actor, spec, fn, afn, self.handler, self.default_tenant)
            setattr(wrapped, _MARKER, self)
            return wrapped

        @functools.wraps(fn)
        def idempotent(*args: Any, **kwargs: Any) -> Any:
            message = _state.take_message(actor.actor_name)
            if message is None:  # a direct call (``actor(...)``), not a message: no dedup
                return fn(*args, **kwargs)
            run = MessageRun(self.handler, spec, actor.broker, message, self.default_tenant)
            return run.run(fn, args, kwargs)

        setattr(idempotent, _MARKER, self)
        return idempotent

    # ------------------------------------------------------------------ messages
    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        _state.clear()
        self.unique.started(message)
        actor = broker.get_actor(message.actor_name)
        if not actor.options.get("idempotent"):
            return
        if getattr(actor.fn, _MARKER, None) is not self:
            raise IdempotencyMiddlewareError(
                f"actor {actor.actor_name!r} is idempotent but was not wrapped by this "
                "IdempotencyMiddleware; add the middleware before declaring actors"
            )
        _state.local.message = message

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        _state.local.message = None
        if exception is not None:
            self.unique.raised(message)
        if exception is None or not broker.get_actor(message.actor_name).options.get("idempotent"):
            return
        if _state.decision_for(exception) is _state.Decision.DEAD_LETTER:
            message.fail()  # dead-letter even if the Retries middleware is configured oddly
        else:
            self.retry_guard.expect_retry(message)  # Retries re-enqueues it, or fails it

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        _state.local.message = None

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        if message.options.get("unique"):  # sent past UniqueActor.send_with_options
            raise IdempotencyMiddlewareError(_NOT_UNIQUE.format(message.actor_name))
        self.retry_guard.enqueue_started(message, delay)

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        self.retry_guard.enqueue_done(message, delay)

    def before_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.retry_guard.before_ack(broker, message)  # raises to keep the original unacked

    def before_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.retry_guard.forget(message)

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        _state.clear()  # drop the reference to the last exception
        self.unique.settled(message, acked=True)

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        _state.clear()
        self.unique.settled(message, acked=False)

    # ------------------------------------------------------------------ worker lifecycle
    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        if not any(isinstance(m, Retries) for m in broker.middleware):
            raise IdempotencyMiddlewareError(
                "IdempotencyMiddleware needs Dramatiq's Retries middleware: without it, "
                "in-progress and store-down messages would be acked instead of retried"
            )
        enable_publisher_confirms(broker, self.handler.logger)
        install_replay_skip_filter()  # replays are not worth Dramatiq's "skipped" warning

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        with self._lock:
            self._workers += 1
            self.retry_guard.resume()
            if self.maintenance and self._workers == 1:
                self.maintenance_runner.start()
                self.handler.logger.info(
                    "dramatiq_maintenance_started", owner=self.maintenance_runner.owner
                )

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        with self._lock:
            self._workers = max(0, self._workers - 1)
            if self._workers == 0:
                self.retry_guard.stop()
            if self.maintenance and self._workers == 0:
                self.maintenance_runner.stop()
                self.handler.logger.info(
                    "dramatiq_maintenance_stopped", owner=self.maintenance_runner.owner
                )


def _retry_policy(broker: dramatiq.Broker, user_retry_when: RetryWhen | None) -> RetryWhen:
    """The ``retry_when`` of an idempotent actor (it overrides Dramatiq's ``max_retries``).

    The wrapped actor already decided for every exception it raised (retry, or dead letter
    because the scope is poisoned / refused); the store's counter — not Dramatiq's
    ``retries`` — ends transient retries, and uncounted retries (in progress, store down)
    never run out.  Exceptions raised elsewhere (another middleware) keep Dramatiq's rule.
    """

    def retry_when(retries: int, exception: BaseException) -> bool:
        decision = _state.decision_for(exception)
        if decision is not None:
            return decision is _state.Decision.RETRY
        if user_retry_when is not None:
            return user_retry_when(retries, exception)
        limit = next(
            (m.max_retries for m in broker.middleware if isinstance(m, Retries)),
            _FALLBACK_MAX_RETRIES,
        )
        return limit is None or retries < limit

    return retry_when
