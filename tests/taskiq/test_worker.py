"""The taskiq outcome table with a real worker process, on taskiq-redis and taskiq-aio-pika,
and a SIGKILLed worker whose task is redelivered and taken over (exactly one effect)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import redis

from idempotent_tasks.taskiq import OUTCOME_LABEL, idempotency_labels

from .._services import REDIS_URL
from .conftest import App, Worker, ping, wait_for, wait_ready

pytestmark = pytest.mark.timeout(180)


def _labels(key: str | None, tenant: str | None = "acme") -> dict[str, str]:
    return idempotency_labels(key, tenant) if key is not None else {}


async def _send(task: Any, *args: Any, key: str | None, tenant: str | None = "acme") -> Any:
    return await task.kicker().with_labels(**_labels(key, tenant)).kiq(*args)


def _get(app: App, name: str) -> int:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.get(f"{app.prefix}:{name}") or 0)
    finally:
        client.close()


def test_executed_then_replayed(app: App, worker: Worker) -> None:
    m = app.module

    async def scenario() -> tuple[Any, Any]:
        await wait_ready(app)
        first = await (await _send(m.charge, "o-1", 5, key="k-1")).wait_result(timeout=30)
        again = await (await _send(m.charge, "o-1", 5, key="k-1")).wait_result(timeout=30)
        return first, again

    first, again = app.run(scenario())
    assert not first.is_err and first.return_value["charged"] == 5
    assert first.labels[OUTCOME_LABEL] == "executed"
    assert again.return_value == first.return_value
    assert again.labels[OUTCOME_LABEL] == "replayed"
    assert _get(app, "effects:o-1") == 1


def test_in_progress_is_sent_again_and_replayed(app: App, worker: Worker) -> None:
    m = app.module

    async def scenario() -> tuple[Any, Any]:
        await wait_ready(app)
        first = await _send(m.slow, 1, key="k-slow")
        wait_for(lambda: _get(app, "slow_runs") == 1, 30, "the first run to start")
        second = await _send(m.slow, 1, key="k-slow")
        # the duplicate comes back (sent again) while the first one holds the lease
        client = redis.Redis.from_url(REDIS_URL)
        try:
            wait_for(lambda: _retried(app, second.task_id), 30, "the duplicate to be resent")
            client.rpush(f"{app.prefix}:release", "go")
        finally:
            client.close()
        return (await first.wait_result(timeout=30), await second.wait_result(timeout=30))

    first, second = app.run(scenario())
    assert first.labels[OUTCOME_LABEL] == "executed" and first.return_value == "slow-1"
    assert second.labels[OUTCOME_LABEL] == "replayed" and second.return_value == "slow-1"
    assert int(second.labels["idempotency_attempt"]) >= 1
    assert _get(app, "slow_runs") == 1


def _retried(app: App, task_id: str) -> bool:
    """The duplicate was seen ``in_progress`` by the worker (and is being sent again)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        kinds = client.lrange(f"{app.prefix}:outcomes:{task_id}", 0, -1)
    finally:
        client.close()
    return b"in_progress" in kinds


def test_transient_failure_is_sent_again_and_counted(app: App, worker: Worker) -> None:
    m = app.module

    async def scenario() -> Any:
        await wait_ready(app)
        return await (await _send(m.flaky, 1, key="k-flaky")).wait_result(timeout=30)

    result = app.run(scenario())
    assert result.labels[OUTCOME_LABEL] == "executed" and result.return_value == 2
    assert _get(app, "flaky_attempts") == 2
    assert m.handler.retry_count(operation="it.flaky", tenant="acme", key="k-flaky") == 1


def test_poisoned_and_rejected_fail_for_good(app: App, worker: Worker) -> None:
    m = app.module

    async def scenario() -> tuple[Any, Any, Any]:
        await wait_ready(app)
        poisoned = await (await _send(m.strict, 1, key="k-strict")).wait_result(timeout=30)
        again = await (await _send(m.strict, 1, key="k-strict")).wait_result(timeout=30)
        rejected = await (await _send(m.charge, "o-9", 1, key=None)).wait_result(timeout=30)
        return poisoned, again, rejected

    poisoned, again, rejected = app.run(scenario())
    assert poisoned.is_err and poisoned.labels[OUTCOME_LABEL] == "poisoned"
    assert again.is_err and again.labels[OUTCOME_LABEL] == "poisoned"
    assert rejected.is_err and rejected.labels[OUTCOME_LABEL] == "rejected"
    assert _get(app, "strict_attempts") == 1  # the permanent error ran once, never again
    assert _get(app, "effects:o-9") == 0


def test_sigkilled_worker_task_is_redelivered_and_taken_over(app: App, worker: Worker) -> None:
    """The body is killed *before* its effect; the broker redelivers the unacked message, the
    lease expires, another worker process takes the scope over: exactly one effect."""
    m = app.module
    client = redis.Redis.from_url(REDIS_URL)

    async def scenario() -> Any:
        await wait_ready(app)
        client.set(f"{app.prefix}:block", "1")
        task = await _send(m.charge, "o-crash", 7, key="k-crash")
        wait_for(lambda: client.get(f"{app.prefix}:blocked_pid") is not None, 30,
                 "the first run to block")
        pid = int(client.get(f"{app.prefix}:blocked_pid") or 0)
        os.kill(pid, signal.SIGKILL)
        # taskiq-redis reclaims a dead consumer's pending messages (XAUTOCLAIM, after
        # idle_timeout) only between reads that returned new messages: keep traffic flowing
        deadline = time.monotonic() + 90
        while not await task.is_ready():
            assert time.monotonic() < deadline, "the killed task was never taken over"
            await ping(app, timeout=2)
        return pid, await task.get_result()

    try:
        killed, result = app.run(scenario())
    finally:
        client.close()
    assert not result.is_err, result.error
    assert result.labels[OUTCOME_LABEL] == "executed"
    assert result.return_value["pid"] != killed  # another worker process ran it
    assert _get(app, "effects:o-crash") == 1
    assert m.handler.retry_count(operation="it.charge", tenant="acme", key="k-crash") == 1
