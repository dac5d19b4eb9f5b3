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

Unique enqueue (``_unique``): the worker releases the marks of ``enqueue_unique`` from the
``task_prerun`` / ``task_postrun`` signals, connected here.

Configuration risks (``_risks``) are computed here and reported by each worker once Celery has
set up its logging, so that they reach the worker's log.
"""

from __future__ import annotations

from typing import Any

import celery
from celery import signals

from .._core.errors import ConfigurationError
from .._core.handler import IdempotencyHandler
from .._core.runner import CLEANUP_EVERY, RECOVER_EVERY, MaintenanceRunner, MaintenanceSchedule
from ..typing import Seconds, seconds
from ._risks import ConfigurationRiskWarning, check_configuration, find_risks, report_once
from ._state import ATTRIBUTE, CLEANUP_TASK, RECOVER_TASK, CeleryState, Maintenance, state_for
from ._task import register_task_options
from ._unique import connect_release_signals


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
    connect_release_signals()
    for task in list(app._tasks.values()):
        register_task_options(app, type(task))
    if app.configured:
        state.risks = [name for name, _ in find_risks(app)]  # reported by the worker
    else:
        app.on_after_configure.connect(_risks_after_configure, sender=app, weak=False)
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
    """Once per app: in a worker of ``app``, report the configuration risks once Celery has set
    up logging (every task module is imported by then), and run in-worker maintenance when
    ``setup`` asked for it."""
    worker_of_app = False
    pool: Any = None  # the worker's pool, as ``--pool`` gave it

    def on_init(sender: Any = None, **_: Any) -> None:
        nonlocal worker_of_app, pool
        if getattr(sender, "app", None) is app:
            worker_of_app, pool = True, getattr(sender, "pool_cls", None)

    def on_logging(**_: Any) -> None:  # sent with sender=None, in the worker's main process
        if worker_of_app:
            report_once(app, pool)

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        report_once(app, pool)  # when the application set up logging itself
        if state_for(app).maintenance == "worker":
            start_maintenance(app)

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            stop_maintenance(app)

    uid = f"idempotent_tasks:{id(app)}"
    signals.worker_init.connect(on_init, weak=False, dispatch_uid=uid)
    signals.after_setup_logger.connect(on_logging, weak=False, dispatch_uid=uid)
    signals.worker_ready.connect(on_ready, weak=False, dispatch_uid=uid)
    signals.worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid)


def start_maintenance(app: celery.Celery) -> MaintenanceRunner:
    """Start (once) this process's maintenance runner for ``app``."""
    state = state_for(app)
    if state.runner is None:
        state.runner = MaintenanceRunner(state.handler, state.schedule)
    state.runner.start()
    state.handler.logger.info("celery_maintenance_started", owner=state.runner.owner)
    return state.runner


def stop_maintenance(app: celery.Celery) -> None:
    """Stop the runner and hand its store leases back."""
    state = state_for(app)
    if state.runner is not None:
        state.runner.stop()
        state.handler.logger.info("celery_maintenance_stopped", owner=state.runner.owner)


# ---------------------------------------------------------------------- configuration risks
def _risks_after_configure(sender: Any = None, **_: Any) -> None:
    state = getattr(sender, ATTRIBUTE, None)
    if isinstance(state, CeleryState):
        state.risks = [name for name, _ in find_risks(sender)]


__all__ = [
    "ConfigurationRiskWarning",
    "check_configuration",
    "setup",
    "start_maintenance",
    "stop_maintenance",
]
