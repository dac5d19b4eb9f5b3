"""Effects outside the database with real Dramatiq workers: a body of three recorded steps
(tests/_three_steps.py) whose worker process group is SIGKILLed after the second step.

Worker subprocesses on RabbitMQ, the SQL store on a SQLite file with the test's own table
prefix (tests/dramatiq/worker_app.py, the fixture of test_real_brokers.py).  The killed
worker's message comes back; once the lease expires the scope is taken over and — per the
operation's ``on_stuck`` — only the third step runs, or ``reconcile`` is asked first:
``done`` records its result and runs nothing, ``notdone`` replays steps one and two and runs
the third, ``unknown`` parks the scope UNCERTAIN and dead-letters the message until an
operator resolves it.  Every step's effect is counted in a file: each happens exactly once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from idempotent_tasks import Status
from tests._three_steps import RECONCILED_RESULT, counted, held_by
from tests._wait import wait_until

from .test_real_brokers import Cluster, cluster  # noqa: F401 - the fixture

ALL_STEPS = ["charge done", "email done", "ledger done"]
ONCE_EACH = {"charge": 1, "email": 1, "ledger": 1}
FIRST_TWO = {"charge": 1, "email": 1, "ledger": 0}

#: RabbitMQ only: the Redis broker's redelivery is the crash tests' business (test_real_brokers).
pytestmark = pytest.mark.parametrize("cluster", ["rabbitmq"], indirect=True)


def crashed(c: Cluster, actor: str, answer: str) -> str:
    """Send ``actor`` with a key naming ``reconcile``'s answer, SIGKILL its worker after the
    second step, start a fresh worker for the redelivery."""
    key = f"{answer}-{uuid.uuid4().hex}"
    first = c.start_worker()
    c.send(actor, "o-1", idempotency_key=key, tenant="acme")
    wait_until(lambda: held_by(c.workdir, key) is not None or c.dead_letters() > 0,
               "the first attempt to finish its second step", 60)
    assert held_by(c.workdir, key) is not None, "the first attempt did not reach its hold"
    c.kill(first)  # the whole process group, after the second step
    assert counted(c.workdir) == FIRST_TWO
    c.start_worker()
    return key


def settled(c: Cluster, actor: str, key: str, status: Status) -> Any:
    wait_until(lambda: getattr(c.record(actor, key), "status", None) is status,
               f"{actor} {status}", 60)
    return c.record(actor, key)


def test_the_takeover_runs_only_the_step_the_killed_worker_had_not_recorded(
    cluster: Cluster,  # noqa: F811
) -> None:
    key = crashed(cluster, "steps", "plain")
    record = settled(cluster, "steps", key, Status.SUCCESS)
    assert record.response == ALL_STEPS and record.retry_count == 1
    assert counted(cluster.workdir) == ONCE_EACH


@pytest.mark.parametrize(("answer", "expected", "effects"), [
    ("done", RECONCILED_RESULT, FIRST_TWO),  # the result recorded, no step runs again
    ("notdone", ALL_STEPS, ONCE_EACH),  # steps one and two replayed, the third runs
])
def test_reconcile_decides_what_the_takeover_runs(
    cluster: Cluster, answer: str, expected: list[str], effects: dict[str, int]  # noqa: F811
) -> None:
    key = crashed(cluster, "reconciled", answer)
    record = settled(cluster, "reconciled", key, Status.SUCCESS)
    assert record.response == expected and record.retry_count == 1
    assert counted(cluster.workdir) == effects
    assert cluster.lines("reconciled") == [answer]


def test_unknown_dead_letters_until_an_operator_retries_it(
    cluster: Cluster,  # noqa: F811
) -> None:
    key = crashed(cluster, "reconciled", "unknown")
    settled(cluster, "reconciled", key, Status.UNCERTAIN)
    wait_until(lambda: cluster.dead_letters() == 1, "the message in the dead letters", 30)
    assert counted(cluster.workdir) == FIRST_TWO  # nothing ran again
    cluster.handler.resolve(operation="reconciled", tenant="acme", key=key, retry=True,
                            by="test")
    cluster.send("reconciled", "o-1", idempotency_key=key, tenant="acme")
    record = settled(cluster, "reconciled", key, Status.SUCCESS)
    assert record.response == ALL_STEPS
    assert counted(cluster.workdir) == ONCE_EACH
    assert cluster.lines("reconciled") == ["unknown"]
