"""The Celery app a crash-test worker *subprocess* runs (``celery -A tests.celery.crash_app``).

Configured from the environment by the test.  The body of ``crash.charge`` writes
``started-<n>`` (with its pid) before its effect; on its first attempt it then blocks until it
is killed.  A later attempt appends the effect line to ``effects`` and returns: the test then
expects exactly one effect (docs/guarantees.md: kill inside the body *before* the effect).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from celery import Celery

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.celery import IdempotentTask, setup
from tests._three_steps import fenced_steps, reconcile_for, three_steps

WORKDIR = Path(os.environ["IT_CRASH_DIR"])
app = Celery(
    "crash_app", broker=os.environ["IT_CRASH_BROKER"], backend=os.environ["IT_CRASH_BACKEND"]
)
app.conf.update(
    task_default_queue=os.environ["IT_CRASH_QUEUE"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
store = SQLStore(os.environ["IT_CRASH_STORE"])
handler = IdempotencyHandler(store, metrics=None, lease_timeout=float(os.environ["IT_CRASH_LEASE"]))
setup(app, handler)


@app.task(base=IdempotentTask, name="crash.charge", wait_backoff=(0.3, 0.6), shared=False)
def charge(order: str) -> str:
    attempt = len(list(WORKDIR.glob("started-*"))) + 1
    (WORKDIR / f"started-{attempt}").write_text(str(os.getpid()))
    if attempt == 1:
        threading.Event().wait(120)  # "mid-task": the test SIGKILLs this process here
    with (WORKDIR / "effects").open("a") as f:
        f.write(f"{order}\n")
    return f"charged {order} on attempt {attempt}"


@app.task(base=IdempotentTask, name="crash.slow", wait_backoff=(0.3, 0.6), shared=False,
          time_limit=3)
def slow(order: str) -> str:
    """Its first attempt outlives the hard ``time_limit``: the pool kills it (a crash)."""
    attempt = len(list(WORKDIR.glob("slow-started-*"))) + 1
    (WORKDIR / f"slow-started-{attempt}").write_text(str(os.getpid()))
    if attempt == 1:
        threading.Event().wait(120)  # killed by the time limit here, before the effect
    with (WORKDIR / "slow-effects").open("a") as f:
        f.write(f"{order}\n")
    return f"charged {order} on attempt {attempt}"


# Effects outside the database (test_effects_worker.py): three recorded steps, the first
# attempt SIGKILLed after the second; ``crash.steps`` takes a crashed attempt over
# (``on_stuck="retry"``), ``crash.reconciled`` asks ``reconcile`` first.
@app.task(base=IdempotentTask, name="crash.steps", wait_backoff=(0.3, 0.6), shared=False)
def steps(order: str) -> list[Any]:
    return three_steps(WORKDIR)


@app.task(base=IdempotentTask, name="crash.reconciled", wait_backoff=(0.3, 0.6), shared=False,
          on_stuck="reconcile", reconcile=reconcile_for(WORKDIR))
def reconciled(order: str) -> list[Any]:
    return three_steps(WORKDIR)


@app.task(base=IdempotentTask, name="crash.fenced", wait_backoff=(0.3, 0.6), shared=False)
def fenced(order: str) -> list[Any]:
    return fenced_steps(WORKDIR)
