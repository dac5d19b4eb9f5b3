"""The Dramatiq app of ``test_retries_enqueue_fault.py``'s worker subprocess.

One idempotent actor, ``charge``, fails transiently on its first attempt and succeeds on the
second, so Dramatiq's Retries must re-enqueue it once.  The :class:`Moment` middleware holds
that re-enqueue at the exact point where the broker connection is to be dropped: before the
publish, it tells the test (a ``retrying`` file) and waits until the test has broken the link
(a ``dropped`` file).  Files rather than pipes, so that the test waits on *events*.

Configured from the environment: ``IT_BROKER`` (rabbitmq|redis), ``IT_BROKER_URL`` (the
test's TCP proxy), ``IT_QUEUE``, ``IT_STORE_URL``, ``IT_TABLE_PREFIX``, ``IT_WORKDIR``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor

QUEUE = os.environ["IT_QUEUE"]
WORKDIR = Path(os.environ["IT_WORKDIR"])
HOLD = 30.0  # longest wait for the test's answer (a bound, not a pacing sleep)


def wait_for_file(name: str) -> None:
    deadline = time.monotonic() + HOLD
    while not (WORKDIR / name).exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # polling a file the test writes


class Moment(Middleware):
    """Stops the first retry enqueue before it publishes, until the test dropped the link."""

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int | None) -> None:
        if delay is None or (WORKDIR / "retrying").exists():
            return
        if os.environ["IT_BROKER"] == "rabbitmq":
            _ = broker.channel  # type: ignore[attr-defined]  # open the publishing connection
        (WORKDIR / "retrying").write_text(message.message_id)
        wait_for_file("dropped")


def make_broker() -> dramatiq.Broker:
    url = os.environ["IT_BROKER_URL"]
    if os.environ["IT_BROKER"] == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url)
    from dramatiq.brokers.redis import RedisBroker

    return RedisBroker(  # type: ignore[no-untyped-call]
        url=url, namespace=f"dq-{QUEUE}", socket_timeout=2, socket_connect_timeout=2
    )


store = SQLStore(os.environ["IT_STORE_URL"], table_prefix=os.environ["IT_TABLE_PREFIX"])
handler = IdempotencyHandler(store, lease_timeout=30, metrics=None)
broker = make_broker()
broker.add_middleware(Moment())
broker.add_middleware(IdempotencyMiddleware(handler, maintenance=False))
dramatiq.set_broker(broker)


@idempotent_actor(queue_name=QUEUE, min_backoff=100, max_backoff=200)
def charge(order_id: str) -> str:
    attempts = WORKDIR / "attempts"
    with attempts.open("a") as f:
        f.write(order_id + "\n")
    if len(attempts.read_text().splitlines()) == 1:
        (WORKDIR / "attempt-1").touch()
        wait_for_file("go")  # the test snapshots the established connections first
        raise ConnectionResetError("a transient failure: Retries must re-enqueue this")
    return f"charged {order_id}"
