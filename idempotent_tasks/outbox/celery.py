"""Running a relay with Celery: a thread in every worker (one of them holds each lease and
publishes, the others stand by), or a periodic task on the beat schedule.

``setup_relay(app, relay, worker=True)`` starts the relay when a worker is ready
(``worker_ready``, in the worker's main process: one relay per worker, whatever its pool) and
stops it at ``worker_shutdown``.  ``setup_relay(app, relay, beat=True, every=1.0)`` registers
the task ``idempotency.outbox_relay`` and a beat entry that runs it every ``every`` seconds;
each run drains the due rows for up to ``every`` seconds and gives its leases up, so any
worker can run the next one.  With beat alone, a message waits up to ``every`` seconds plus
the task's queueing delay; the worker thread (woken by ``LISTEN`` on PostgreSQL) is faster.
"""

from __future__ import annotations

from typing import Any

from .relay import OutboxRelay

RELAY_TASK = "idempotency.outbox_relay"
DEFAULT_EVERY = 1.0


def setup_relay(app: Any, relay: OutboxRelay, *, worker: bool = False, beat: bool = False,
                every: float = DEFAULT_EVERY) -> None:
    """Run ``relay`` in ``app``'s workers (``worker=True``) and/or from beat (``beat=True``)."""
    if worker:
        _in_workers(app, relay)
    if beat:
        _on_beat(app, relay, every)


def _in_workers(app: Any, relay: OutboxRelay) -> None:
    """Connected for ``app``'s workers only (a process may run workers of several apps)."""
    from celery import signals

    def ours(sender: Any) -> bool:
        return getattr(sender, "app", app) is app

    def started(sender: Any = None, **_: Any) -> None:
        if ours(sender):
            relay.start()

    def stopped(sender: Any = None, **_: Any) -> None:
        if ours(sender):
            relay.stop()

    signals.worker_ready.connect(started, weak=False)
    signals.worker_shutdown.connect(stopped, weak=False)


def _on_beat(app: Any, relay: OutboxRelay, every: float) -> None:
    @app.task(name=RELAY_TASK, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def relay_task() -> dict[str, int]:
        try:
            report = relay.drain(max_seconds=every)
        finally:
            relay.release()
        return {"published": report.published, "rejected": report.rejected,
                "poisoned": report.poisoned}

    schedule = dict(app.conf.beat_schedule or {})
    schedule[RELAY_TASK] = {"task": RELAY_TASK, "schedule": every,
                            "options": {"expires": max(every * 2, 1.0)}}
    app.conf.beat_schedule = schedule


__all__ = ["RELAY_TASK", "setup_relay"]
