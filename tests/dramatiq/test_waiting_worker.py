"""A duplicate that waits (``on_in_progress="wait"``) on a first attempt whose Dramatiq worker
process is SIGKILLed: the waiter answers ``in_progress`` once the dead worker's lease runs
out — it neither hangs until its ``wait_timeout`` nor takes the scope over itself — and the
takeover is a later delivery's: the broker redelivers the killed worker's message to a fresh
worker, which takes the expired lease over (counted) and runs the body once.

The first attempt runs in a worker subprocess (tests/dramatiq/worker_app.py, ``crashy``: its
first attempt blocks before its effect) with a heartbeat, so its lease is renewed for as long
as the process lives and runs out only because it was killed.  The waiter is a duplicate
delivery in the test process through the same store: the same scope and the payload the
Dramatiq integration hashes (``{"args": [...], "kwargs": {}}``), its wait observed through
the handler's ``duplicate_waiting`` event.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idempotent_tasks import (
    ErrorCode,
    IdempotencyHandler,
    SQLStore,
    Status,
    create_logger_adapter,
)
from tests._every_store import Events
from tests._wait import budget

from .test_real_brokers import Cluster, cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.parametrize("cluster", ["rabbitmq"], indirect=True)

SCOPE = {"operation": "crashy", "tenant": "acme", "key": "waited-1"}
PAYLOAD = {"args": ["o-1"], "kwargs": {}}


def _lease(c: Cluster) -> float | None:
    record = c.record("crashy", SCOPE["key"])
    return None if record is None else record.lease_expires_at


def test_a_waiter_on_a_killed_first_attempt_gets_in_progress_and_a_later_delivery_takes_over(
    cluster: Cluster,  # noqa: F811
) -> None:
    cluster.env.update(IT_LEASE="2", IT_HEARTBEAT="0.2")
    first = cluster.start_worker()
    cluster.send("crashy", "o-1", idempotency_key=SCOPE["key"], tenant="acme")
    cluster.wait("the first attempt to start", lambda: (cluster.workdir / "started").exists())
    claimed = cluster.record("crashy", SCOPE["key"])
    assert claimed.status is Status.PROCESSING
    cluster.wait("the heartbeat to renew the lease",
                 lambda: (_lease(cluster) or 0) > claimed.lease_expires_at)

    events = Events()
    store = SQLStore(cluster.env["IT_STORE_URL"], table_prefix=cluster.env["IT_TABLE_PREFIX"])
    waiter_handler = IdempotencyHandler(store, metrics=None, logger=create_logger_adapter(events))
    ran: list[str] = []
    outcomes: list[Any] = []
    waiter = threading.Thread(target=lambda: outcomes.append(waiter_handler.run(
        lambda: ran.append("waiter"), payload=PAYLOAD, on_in_progress="wait",
        wait_timeout=budget(300), **SCOPE,
    )))
    waiter.start()
    events.wait_for("duplicate_waiting")
    cluster.kill(first)  # SIGKILL the worker's process group while the duplicate waits
    waiter.join(budget(60))
    assert not waiter.is_alive(), "the waiter never answered"

    (outcome,) = outcomes
    assert (outcome.kind, outcome.error_code) == ("in_progress", ErrorCode.REQUEST_IN_PROGRESS)
    assert ran == [] and cluster.lines("effects") == []
    left = cluster.record("crashy", SCOPE["key"])  # nobody took it over: the waiter only answered
    assert (left.status, left.fencing_token) == (Status.PROCESSING, claimed.fencing_token)

    cluster.start_worker()  # the killed worker's message comes back to it
    cluster.wait("the takeover to finish", lambda: getattr(
        cluster.record("crashy", SCOPE["key"]), "status", None) is Status.SUCCESS, 60)
    record = cluster.record("crashy", SCOPE["key"])
    assert cluster.lines("effects") == ["o-1"]  # the body's effect, exactly once
    assert (record.response, record.retry_count) == ("o-1", 1)
    assert record.fencing_token > claimed.fencing_token
    waiter_handler.close()
    store.close()
