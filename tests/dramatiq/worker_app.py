"""The Dramatiq app that worker *subprocesses* run in the real-broker tests.

Configured entirely from environment variables (set by ``test_real_brokers.py``) so that each
test gets its own queue / namespace and its own store tables:
``IT_BROKER`` (rabbitmq|redis), ``IT_BROKER_URL``, ``IT_QUEUE``, ``IT_STORE_URL``,
``IT_TABLE_PREFIX``, ``IT_WORKDIR``, ``IT_LEASE``, and ``IT_HEARTBEAT`` (seconds; unset: no
heartbeat, the lease runs out ``IT_LEASE`` seconds after the claim).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import dramatiq

from idempotent_tasks import IdempotencyHandler, SQLStore, current_context
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor
from tests._three_steps import reconcile_for, three_steps

QUEUE = os.environ["IT_QUEUE"]
WORKDIR = Path(os.environ["IT_WORKDIR"])
FAST: dict[str, Any] = {"min_backoff": 200, "max_backoff": 600, "queue_name": QUEUE}


def make_broker() -> dramatiq.Broker:
    url = os.environ["IT_BROKER_URL"]
    if os.environ["IT_BROKER"] == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url)
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(  # type: ignore[no-untyped-call]
        url=url, namespace=f"dq-{QUEUE}", heartbeat_timeout=2000, maintenance_chance=1_000_000
    )


store = SQLStore(os.environ["IT_STORE_URL"], table_prefix=os.environ["IT_TABLE_PREFIX"])
_HEARTBEAT = os.environ.get("IT_HEARTBEAT")
handler = IdempotencyHandler(
    store, lease_timeout=float(os.environ.get("IT_LEASE", "2")),
    heartbeat_interval=None if _HEARTBEAT is None else float(_HEARTBEAT),
)
broker = make_broker()
broker.add_middleware(IdempotencyMiddleware(handler, recover_every=0.5, cleanup_every=60))
dramatiq.set_broker(broker)


def _append(name: str, line: str) -> int:
    """Append a line (one write, O_APPEND); returns how many lines the file had before."""
    path = WORKDIR / name
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        f.write(line + "\n")
    return before


@idempotent_actor(**FAST)
def crashy(order_id: str) -> str:
    """First attempt: signal, then block until SIGKILLed, *before* the effect (docs/guarantees.md)."""
    ctx = current_context()
    previous = _append("attempts", f"{order_id} {ctx.retry_count if ctx else '?'}")
    if previous == 0:
        (WORKDIR / "started").write_text(str(os.getpid()))
        threading.Event().wait()  # blocks until the test kills the whole process group
    _append("effects", order_id)
    return order_id


@idempotent_actor(**FAST)
def effect(order_id: str) -> None:
    _append("effects", order_id)


@idempotent_actor(max_retries=2, **FAST)
def always_fails(order_id: str) -> None:
    _append("failures", order_id)
    raise ConnectionError("transient, forever")


# Effects outside the database (test_effects_worker.py): three recorded steps, the first
# attempt SIGKILLed after the second; ``steps`` takes a crashed attempt over
# (``on_stuck="retry"``), ``reconciled`` asks ``reconcile`` first.
@idempotent_actor(**FAST)
def steps(order_id: str) -> list[Any]:
    return three_steps(WORKDIR)


@idempotent_actor(on_stuck="reconcile", reconcile=reconcile_for(WORKDIR), **FAST)
def reconciled(order_id: str) -> list[Any]:
    return three_steps(WORKDIR)
