"""``setup(app, handler)``: attach the handler, install maintenance, check the configuration.

Maintenance (non-negotiable 5: recovery and cleanup run on a schedule from day one):

* ``maintenance="beat"`` (default): the tasks ``idempotency.recover_stuck`` and
  ``idempotency.cleanup_expired`` are registered on the app and, with ``beat=True``, beat
  entries of the same names run them every ``recover_every`` / ``cleanup_every`` seconds.
  Running them twice at once is harmless: every change they make is a conditional write.
* ``maintenance="worker"``: no beat needed; each worker starts a
  :class:`~idempotent_tasks.MaintenanceRunner` when it is ready (``worker_ready``)
  and stops it on ``worker_shutdown``; a lease in the store lets one worker of the fleet run each
  job per interval.  Embedded workers that send no ``worker_ready`` (``start_worker``) call
  :func:`start_maintenance` / :func:`stop_maintenance` themselves.
"""

from __future__ import annotations

from typing import Any

import celery
from celery import signals

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.runner import CLEANUP_EVERY, RECOVER_EVERY, MaintenanceRunner, MaintenanceSchedule
from ..typing import Seconds, seconds
from ._state import ATTRIBUTE, CLEANUP_TASK, RECOVER_TASK, CeleryState, Maintenance, state_for
from ._task import IdempotentTask, register_task_options

#: RabbitMQ's default ``consumer_timeout`` (server side, 30 minutes).
RABBITMQ_CONSUMER_TIMEOUT = 1800.0


def setup(
    app: celery.Celery,
    handler: IdempotencyHandler,
    *,
    beat: bool = True,
    default_tenant: str | None = None,
    maintenance: Maintenance = "beat",
    recover_every: Seconds = RECOVER_EVERY,
    cleanup_every: Seconds = CLEANUP_EVERY,
) -> CeleryState:
    """Attach ``handler`` to ``app`` and install recovery/cleanup (module docstring).

    ``default_tenant`` declares the app single-tenant: tasks without a tenant use it instead of
    failing with ``MISSING_TENANT``.  Calling ``setup`` again replaces the previous state.
    """
    if maintenance not in ("beat", "worker"):
        raise ConfigurationError("maintenance must be 'beat' or 'worker'")
    old = getattr(app, ATTRIBUTE, None)
    if isinstance(old, CeleryState) and old.runner is not None:
        old.runner.stop()
    schedule = MaintenanceSchedule(seconds(recover_every), seconds(cleanup_every))
    state = CeleryState(handler, default_tenant, maintenance, schedule)
    setattr(app, ATTRIBUTE, state)
    _register_maintenance_tasks(app)
    if maintenance == "beat" and beat:
        _install_beat(app, schedule)
    _connect_worker_signals(app)
    for task in list(app._tasks.values()):
        register_task_options(app, type(task))
    if app.configured:
        state.risks = check_configuration(app)
    else:
        app.on_after_configure.connect(_check_after_configure, sender=app, weak=False)
    return state


# ---------------------------------------------------------------------- maintenance
def _register_maintenance_tasks(app: celery.Celery) -> None:
    @app.task(name=RECOVER_TASK, shared=False)  # type: ignore[untyped-decorator]
    def recover_stuck(timeout: float | None = None, limit: int = 100) -> int:
        """Count and release (or poison) PROCESSING records whose worker died."""
        return state_for(app).handler.recover_stuck_records(timeout, limit)

    @app.task(name=CLEANUP_TASK, shared=False)  # type: ignore[untyped-decorator]
    def cleanup_expired(limit: int = 500) -> int:
        """Purge expired records and stale counters."""
        return state_for(app).handler.cleanup_expired_records(limit)


def _install_beat(app: celery.Celery, schedule: MaintenanceSchedule) -> None:
    for name, every in ((RECOVER_TASK, schedule.recover_every),
                        (CLEANUP_TASK, schedule.cleanup_every)):
        app.add_periodic_task(every, app.signature(name), name=name)


def _connect_worker_signals(app: celery.Celery) -> None:
    """Once per app: re-check the configuration when a worker starts (every task module is
    imported by then) and run in-worker maintenance when ``setup`` asked for it."""

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            state_for(app).risks = check_configuration(app)

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and state_for(app).maintenance == "worker":
            start_maintenance(app)

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            stop_maintenance(app)

    uid = f"idempotent_tasks:{id(app)}"
    signals.worker_init.connect(on_init, weak=False, dispatch_uid=uid)
    signals.worker_ready.connect(on_ready, weak=False, dispatch_uid=uid)
    signals.worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid)


def start_maintenance(app: celery.Celery) -> MaintenanceRunner:
    """Start (once) this process's maintenance runner for ``app``."""
    state = state_for(app)
    if state.runner is None:
        state.runner = MaintenanceRunner(state.handler, state.schedule)
    state.runner.start()
    state.handler.log.info("celery_maintenance_started", owner=state.runner.owner)
    return state.runner


def stop_maintenance(app: celery.Celery) -> None:
    """Stop the runner and hand its store leases back."""
    state = state_for(app)
    if state.runner is not None:
        state.runner.stop()
        state.handler.log.info("celery_maintenance_stopped", owner=state.runner.owner)


# ---------------------------------------------------------------------- configuration risks
def _check_after_configure(sender: Any = None, **_: Any) -> None:
    state = getattr(sender, ATTRIBUTE, None)
    if isinstance(state, CeleryState):
        state.risks = check_configuration(sender)


def check_configuration(app: celery.Celery) -> list[str]:
    """Log (warning) every setting that makes a double run or a lost task possible; returns
    the risk names.  See docs/celery.md, "Leases, visibility_timeout and consumer_timeout"."""
    state = state_for(app)
    handler, conf = state.handler, app.conf
    lease = handler.defaults.lease_timeout
    risks: list[tuple[str, dict[str, Any]]] = []
    time_limit = conf.task_time_limit
    if handler.heartbeat_interval is None and (time_limit is None or time_limit > lease):
        risks.append(("lease_may_expire_while_running",
                      {"lease_timeout": lease, "task_time_limit": time_limit}))
    risks.extend(_broker_risks(conf, lease))
    risks.extend(_task_risks(app))
    for name, fields in risks:
        handler.log.warning("celery_config_risk", risk=name, **fields)
    return [name for name, _ in risks]


def _broker_risks(conf: Any, lease: float) -> list[tuple[str, dict[str, Any]]]:
    url = str(conf.broker_url or "")
    scheme = url.split("://", 1)[0].lower()
    risks: list[tuple[str, dict[str, Any]]] = []
    if scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        if not conf.broker_heartbeat:
            risks.append(("broker_heartbeat_disabled", {"broker_heartbeat": conf.broker_heartbeat}))
        if lease > RABBITMQ_CONSUMER_TIMEOUT:
            risks.append(("lease_exceeds_consumer_timeout",
                          {"lease_timeout": lease, "consumer_timeout": RABBITMQ_CONSUMER_TIMEOUT}))
    # Redis/SQS: a task running past visibility_timeout is delivered again while running; the
    # copy sees REQUEST_IN_PROGRESS and waits, which is safe exactly while the lease is live —
    # the heartbeat/time-limit check above covers it, so no separate risk here.
    return risks


def _task_risks(app: celery.Celery) -> list[tuple[str, dict[str, Any]]]:
    risks: list[tuple[str, dict[str, Any]]] = []
    for task in list(app._tasks.values()):
        if not isinstance(task, IdempotentTask):
            continue
        if not task.acks_late:
            risks.append(("acks_early_loses_crashed_tasks", {"task": task.name}))
        if not task.reject_on_worker_lost:
            risks.append(("worker_lost_not_redelivered", {"task": task.name}))
    return risks
