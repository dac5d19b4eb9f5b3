"""The project's Celery tasks: ``transactional=True`` bodies writing ORM rows.

``orders.charge`` writes its ``Charge`` row, then, when ``IDEM_DJANGO_HOLD`` names a
directory, records that it is inside the body (``inside-<n>`` with its pid) and, on its first
attempt, blocks there: the crash test SIGKILLs the worker at that point, with the row written
but not committed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from idempotent_tasks.celery import IdempotentTask

from ..celery_app import app
from .models import Charge


@app.task(base=IdempotentTask, name="orders.charge", transactional=True,
          wait_backoff=(0.2, 0.5), shared=False)
def charge(order_id: str, amount: int, conn: Any = None) -> dict[str, Any]:
    row = Charge.objects.create(order_id=order_id, amount=amount)
    hold = os.environ.get("IDEM_DJANGO_HOLD")
    if hold:
        attempt = len(list(Path(hold).glob("inside-*"))) + 1
        (Path(hold) / f"inside-{attempt}").write_text(str(os.getpid()))
        if attempt == 1:
            threading.Event().wait(120)  # the test SIGKILLs this worker here
    return {"charge": row.pk, "order": order_id, "database": conn.alias if conn else None}


@app.task(base=IdempotentTask, name="orders.charge_then_fail", transactional=True,
          default_retry_delay=0.1, shared=False)
def charge_then_fail(order_id: str) -> None:
    Charge.objects.create(order_id=order_id, amount=1)
    raise RuntimeError("after the write")
