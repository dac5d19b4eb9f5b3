"""The taskiq middleware: hands each message of an ``@idempotent`` task to its wrapper
(``pre_execute``), sends retried messages again (``on_error``), labels the result with its
outcome (``post_execute``), and checks the tasks when a worker starts (``startup``).  For
every task it also releases the marks of ``enqueue_unique`` (``_unique``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.exceptions import NoResultError
from taskiq.kicker import AsyncKicker

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.runner import MaintenanceRunner
from ..consumers._loop import DEFAULT_RETRY_BACKOFF, Backoff
from ..typing import OnFailure, OnInProgress, OnSuccess, Reconcile, Seconds
from . import _delivery
from ._spec import ATTEMPT_LABEL, MARK_LABEL, OUTCOME_LABEL, SPEC_ATTRIBUTE
from ._unique import UniqueRelease


class IdempotencyMiddleware(TaskiqMiddleware):
    """Exactly-once execution per (tenant, operation, key) for tasks declared with
    :func:`~idempotent_tasks.taskiq.idempotent`.

    ``default_tenant`` declares a single-tenant app (without it, a message with no tenant is
    refused: ``MISSING_TENANT``).  ``retry_backoff=(initial_s, max_s)`` is the wait before a
    message that must come back later (in progress, failed, store down) is sent again; the
    original is held unacked meanwhile.  ``maintenance=True`` runs ``recover_stuck_records``
    and ``cleanup_expired_records`` in a thread of each worker process, with a store lease so
    that one worker of the fleet runs each job at a time (sync stores; otherwise run
    ``idempotent-tasks recover`` / ``cleanup`` from a scheduler).  ``on_outcome`` is called
    with each message and its :class:`~idempotent_tasks.Outcome` (metrics, audit, tests);
    it must not raise.  The per-operation policies (``on_in_progress``, ``wait_timeout``,
    ``on_success``, ``reuse_after``, ``on_failure``, ``reconcile``) given here apply to every
    idempotent task of the broker; a task's own (``@idempotent(...)``) win, then the
    handler's apply.
    """

    def __init__(
        self,
        handler: IdempotencyHandler,
        *,
        default_tenant: str | None = None,
        retry_backoff: tuple[float, float] = DEFAULT_RETRY_BACKOFF,
        maintenance: bool = False,
        on_outcome: Callable[[TaskiqMessage, Outcome], None] | None = None,
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
        reconcile: Reconcile | None = None,
    ) -> None:
        super().__init__()
        self.policies: dict[str, Any] = {
            name: value for name, value in (
                ("on_in_progress", on_in_progress), ("wait_timeout", wait_timeout),
                ("on_success", on_success), ("reuse_after", reuse_after),
                ("on_failure", on_failure), ("reconcile", reconcile),
            ) if value is not None
        }
        handler.defaults.merged(**self.policies)  # a bad value fails here, not on a message
        self.on_outcome = on_outcome
        self.handler = handler
        self.default_tenant = default_tenant
        self.backoff = Backoff(retry_backoff)
        self.maintenance = MaintenanceRunner(handler) if maintenance else None
        self.unique = UniqueRelease(handler)  # the marks of ``enqueue_unique``, every task

    # ------------------------------------------------------------------ lifecycle
    def startup(self) -> None:
        for name, task in self.broker.get_all_tasks().items():
            if not task.labels.get(MARK_LABEL):
                continue
            spec = getattr(task.original_func, SPEC_ATTRIBUTE, None)
            if spec is None:
                raise ConfigurationError(
                    f"task {name!r} has the label idempotent=True but was not declared with "
                    "idempotent_tasks.taskiq.idempotent(broker, ...)"
                )
            if spec.overrides:  # recovery and cleanup use what its messages use
                self.handler.register_operation(
                    spec.operation or name, **{**self.policies, **spec.overrides}
                )
        if self.maintenance is not None and self.broker.is_worker_process:
            self.maintenance.start()

    def shutdown(self) -> None:
        if self.maintenance is not None and self.broker.is_worker_process:
            self.maintenance.stop()

    # ------------------------------------------------------------------ one message
    async def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        await self.unique.started(message)
        task = self.broker.find_task(message.task_name)
        if task is not None and task.labels.get(MARK_LABEL):
            _delivery.current.set(
                _delivery.Delivery(self.handler, self.default_tenant, message, self.on_outcome,
                                   broker=self.broker, policies=self.policies)
            )
        return message

    async def on_error(
        self, message: TaskiqMessage, result: TaskiqResult[Any], exception: BaseException
    ) -> None:
        delivery = _delivery.current.get()
        if delivery is None or delivery.message is not message or delivery.outcome is None:
            return
        outcome = delivery.outcome
        if outcome.retry:
            await self._send_again(message, outcome.kind)
            result.error = NoResultError()  # the copy's result will be the task's result
            return
        code = outcome.error_code
        self.handler.logger.warning(
            "taskiq_task_dead_lettered", task=message.task_name, task_id=message.task_id,
            kind=outcome.kind, error_code=None if code is None else code.value,
            error=outcome.error, tenant=outcome.tenant, key=outcome.key,
        )

    async def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        delivery = _delivery.current.get()
        if delivery is None or delivery.message is not message:
            await self.unique.ended(message, result, final_failure=False)
            return
        _delivery.current.set(None)
        outcome = delivery.outcome
        await self.unique.ended(message, result,
                                final_failure=outcome is not None and not outcome.retry)
        if outcome is not None:
            result.labels = {**result.labels, OUTCOME_LABEL: outcome.kind}

    async def _send_again(self, message: TaskiqMessage, reason: str) -> None:
        """Hold the message for the backoff, then kick a copy (same task id and labels);
        the receiver acks the original only after this returns."""
        attempt = int(message.labels.get(ATTEMPT_LABEL, 0) or 0)
        delay = self.backoff.delay(attempt)
        self.handler.logger.info(
            "taskiq_retry_scheduled", task=message.task_name, task_id=message.task_id,
            reason=reason, delay=round(delay, 3), attempt=attempt + 1,
        )
        await asyncio.sleep(delay)
        labels = {k: v for k, v in message.labels.items() if k != OUTCOME_LABEL}
        kicker: AsyncKicker[Any, Any] = AsyncKicker(
            task_name=message.task_name, broker=self.broker, labels=labels,
        ).with_task_id(message.task_id).with_labels(**{ATTEMPT_LABEL: attempt + 1})
        await kicker.kiq(*message.args, **message.kwargs)


__all__ = ["IdempotencyMiddleware"]
