"""Celery settings that make a double run or a lost task possible, and where they are reported.

:func:`find_risks` only reads the app's configuration and tasks.  :func:`report` emits each
risk twice over: a ``celery_config_risk`` warning on the handler's logger (structured fields),
and a Python warning of category :class:`ConfigurationRiskWarning` — so that it shows wherever
the application looks (its log, ``-W error`` in a test suite, ``warnings.catch_warnings``).

*When* matters.  A worker imports the app (and runs ``setup``) before Celery configures
logging, so a warning logged then goes nowhere — that is how a 25 s task with a 10 s lease and
no heartbeat ran three times on the Redis broker without a word in the worker's log.  So
``setup`` only *computes* the risks; a worker reports them once Celery has set up logging
(``after_setup_logger``, or ``worker_ready`` when the application handles logging itself and
that signal is not sent), exactly once per app and process.  :func:`check_configuration`
computes and reports on demand.
"""

from __future__ import annotations

import warnings
from typing import Any

import celery

from ._state import state_for
from ._task import IdempotentTask

#: RabbitMQ's default ``consumer_timeout`` (server side, 30 minutes).
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
_REPORTED = "_idempotent_tasks_risks_reported"

Risk = tuple[str, dict[str, Any]]


class ConfigurationRiskWarning(UserWarning):
    """A setting that makes a double run or a lost task possible (docs/celery.md, "Leases,
    visibility_timeout and consumer_timeout"); the message starts with the risk's name."""


def check_configuration(app: celery.Celery) -> list[str]:
    """Report (log and warn) every setting that makes a double run or a lost task possible;
    returns the risk names.  See docs/celery.md, "Leases, visibility_timeout and
    consumer_timeout"."""
    app.finalize(auto=True)  # every task of the app is known, as in a worker
    risks = find_risks(app)
    report(app, risks)
    return [name for name, _ in risks]


def find_risks(app: celery.Celery, pool: Any = None) -> list[Risk]:
    """The risks of ``app``'s configuration, without reporting them; ``pool``: the worker's
    pool (name or class) when known, else ``worker_pool``."""
    state = state_for(app)
    handler, conf = state.handler, app.conf
    lease = handler.defaults.lease_timeout
    risks: list[Risk] = []
    time_limit = conf.task_time_limit
    if handler.heartbeat_interval is None and (time_limit is None or time_limit > lease):
        risks.append(("lease_may_expire_while_running",
                      {"lease_timeout": lease, "task_time_limit": time_limit}))
    risks.extend(_broker_risks(conf, lease, conf.worker_pool if pool is None else pool))
    risks.extend(_task_risks(app))
    return risks


def report(app: celery.Celery, risks: list[Risk]) -> None:
    log = state_for(app).handler.logger
    for name, fields in risks:
        log.warning("celery_config_risk", risk=name, **fields)
        details = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        warnings.warn(ConfigurationRiskWarning(f"{name}: {details} (app {app.main!r})"),
                      stacklevel=2)


def report_once(app: celery.Celery, pool: Any = None) -> None:
    """In a worker, after logging is set up: report the app's risks, once per process."""
    if getattr(app, _REPORTED, False):
        return
    setattr(app, _REPORTED, True)
    app.finalize(auto=True)  # what the worker does next: every task of the app is known
    state = state_for(app)
    risks = find_risks(app, pool)
    state.risks = [name for name, _ in risks]
    report(app, risks)


def _broker_risks(conf: Any, lease: float, pool: Any) -> list[Risk]:
    url = str(conf.broker_url or "")
    scheme = url.split("://", 1)[0].lower()
    risks: list[Risk] = []
    if scheme in _AMQP_SCHEMES:
        if not conf.broker_heartbeat:
            risks.append(("broker_heartbeat_disabled", {"broker_heartbeat": conf.broker_heartbeat}))
        if _is_threads_pool(pool) and conf.get("worker_enable_prefetch_count_reduction"):
            # After a reconnect Celery restores the prefetch count from the thread that acks
            # a task: a basic.qos that reads the consumer connection while the main thread
            # reads it too, desynchronising it (docs/celery.md).
            risks.append(("prefetch_reduction_with_threads_pool",
                          {"worker_pool": "threads",
                           "worker_enable_prefetch_count_reduction": True}))
        if lease > RABBITMQ_CONSUMER_TIMEOUT:
            risks.append(("lease_exceeds_consumer_timeout",
                          {"lease_timeout": lease, "consumer_timeout": RABBITMQ_CONSUMER_TIMEOUT}))
    # Redis/SQS: a task running past visibility_timeout is delivered again while running; the
    # copy sees REQUEST_IN_PROGRESS and waits, which is safe exactly while the lease is live —
    # the heartbeat/time-limit check above covers it, so no separate risk here.
    return risks


def _is_threads_pool(pool: Any) -> bool:
    """``--pool threads``: the alias, the class's path, or the class."""
    name = str(pool if isinstance(pool, str) else getattr(pool, "__module__", ""))
    return name == "threads" or name.startswith("celery.concurrency.thread")


def _task_risks(app: celery.Celery) -> list[Risk]:
    risks: list[Risk] = []
    for task in list(app._tasks.values()):
        if not isinstance(task, IdempotentTask):
            continue
        if not task.acks_late:
            risks.append(("acks_early_loses_crashed_tasks", {"task": task.name}))
        if not task.reject_on_worker_lost:
            risks.append(("worker_lost_not_redelivered", {"task": task.name}))
        if _hard_limit_acks(app, task):
            risks.append(("hard_time_limit_drops_task",
                           {"task": task.name, "time_limit": _time_limit(app, task)}))
    return risks


def _time_limit(app: celery.Celery, task: Any) -> float | None:
    limit = task.time_limit if task.time_limit is not None else app.conf.task_time_limit
    return None if limit is None else float(limit)


def _hard_limit_acks(app: celery.Celery, task: Any) -> bool:
    """A hard time limit that acks the message: the killed attempt is never redelivered (a
    Celery without ``acks_on_timeout``, or a task that sets it to True)."""
    if _time_limit(app, task) is None or not task.acks_late:
        return False
    if not hasattr(celery.Task, "acks_on_timeout"):  # Celery < 5.7: acks on a hard timeout
        return bool(task.acks_on_failure_or_timeout
                    if task.acks_on_failure_or_timeout is not None
                    else app.conf.task_acks_on_failure_or_timeout)
    return bool(task.acks_on_timeout)


__all__ = ["ConfigurationRiskWarning", "check_configuration", "find_risks", "report_once"]
