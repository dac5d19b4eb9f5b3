"""The two Celery integrations of the chaos suite: on RabbitMQ, and on the Redis broker.

Both run ``celery worker --pool threads --concurrency 4`` subprocesses of
``tests.chaos.celery_app``, publish each delivery as a task message of its own, and read every
delivery's result (fresh or replayed) back from the Redis result backend.

* RabbitMQ (a vhost per run), publishing with confirms on both sides; the broker fault closes
  every connection of the vhost.
* Redis: a private ``redis-server`` as the broker, ``visibility_timeout`` = 4 s and kombu's
  unacked-restore sweep every second (``unacked_restore_interval=1``,
  ``unacked_restore_throttle=1``; kombu 5.7's defaults sweep every 10 x 10 s).  A few *slow
  keys* run 8 s, past the visibility timeout, so the broker delivers them again *while they
  run*; the broker fault is ``CLIENT KILL TYPE normal`` on the broker.  :meth:`figures` counts
  those redeliveries from the workers' logs.

  kombu's Redis transport takes a message off the queue (``BRPOP``) and records it as unacked
  in a second round trip: a worker killed, or a connection dropped, between the two loses the
  message — it is neither queued nor unacked, and no worker ever ran it (kombu issue 305).
  No task-level code can see it.  :meth:`resend_lost` does what docs/celery.md tells a producer
  that must not lose an operation to do — send again, same key and task id, what never got an
  answer — but only when the broker lost the *message*: the delivery's last message (the
  producer's, or a retry a worker published — the workers log every delivery and every retry
  they publish) was never received by any worker, and the broker no longer holds it, seen so on
  two checks in a row; each one is counted (``broker_losses_resent``).  A delivery whose last
  message a worker did receive is never resent: if it stays unanswered the run fails.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from tests._services import REDIS_URL

from ._body import OPERATIONS, TENANT, WorkerConfig
from ._faults import PrivateRedis, RabbitVhost, Workers, rabbitmqctl
from ._harness import Delivery
from ._integrations import BaseIntegration

VISIBILITY_TIMEOUT = 4.0
SLOW_SECONDS = 8.0  # twice the visibility timeout: room for a restore sweep under load
#: ``unacked_mutex_expire``: the sweep's lock; a worker killed while holding it (once a second
#: here) would block every restore for kombu's default 300 s.
REDIS_TRANSPORT = {"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 1,
                   "unacked_restore_throttle": 1, "unacked_mutex_expire": 10}
_DELIVERY = re.compile(r"chaos_delivery task_id=(\S+) key=(\S+) redelivered=(\w+) at=([\d.]+)")
_SLOW = re.compile(r"chaos_slow_body key=(\S+) start=([\d.]+) end=([\d.]+)")
_RETRY = re.compile(r"chaos_retry task_id=(\S+) at=([\d.]+)")


class _CeleryIntegration(BaseIntegration):
    stop_seconds = 4.5  # longer than the 3 s lease: duplicates elsewhere take over

    def __init__(self, broker_url: str, run_id: str, transport: dict[str, Any]) -> None:
        from celery import Celery

        super().__init__()
        self.broker_url, self.transport = broker_url, transport
        self.queue = f"chaos-{run_id}"
        self.app = Celery("chaos-producer", broker=broker_url, set_as_current=False)
        self.app.conf.update(task_default_queue=self.queue, broker_connection_retry_on_startup=True,
                             broker_transport_options=transport)
        self._redis = redis.Redis.from_url(REDIS_URL)

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "tests.chaos.celery_app", "worker",
                "--pool", "threads", "--concurrency", "4", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
                "-Q", self.queue]

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        return replace(base, broker_url=self.broker_url, queue=self.queue, result_url=REDIS_URL,
                       broker_options=self.transport)

    def publish(self, delivery: Delivery) -> None:
        result = self.app.send_task(
            OPERATIONS[delivery.profile], args=(delivery.key,), queue=self.queue,
            headers={"idempotency_key": delivery.key, "idempotency_tenant": TENANT},
        )
        self._sent.add(delivery, result.id)

    def _backend_states(self) -> list[str]:
        """What the result backend holds for each unanswered delivery."""
        lines = []
        for _, i in self._sent.items():
            if i not in self._answers:
                raw = self._redis.get(f"celery-task-meta-{i}")
                meta = json.loads(raw) if raw else {}
                lines.append(f"result backend {i}: {meta.get('status')} "
                             f"date_done={meta.get('date_done')} result={meta.get('result')}")
        return lines[:20]

    def results(self) -> dict[str, list[Any]]:
        pending = [i for _, i in self._sent.items() if i not in self._answers]
        for start in range(0, len(pending), 500):
            chunk = pending[start:start + 500]
            values = self._redis.mget([f"celery-task-meta-{i}" for i in chunk])
            for task_id, raw in zip(chunk, values, strict=True):
                meta = json.loads(raw) if raw else {}
                if meta.get("status") == "SUCCESS":
                    self._answers[task_id] = [meta["result"]]
        return self._answers

    def close(self) -> None:
        ids = [f"celery-task-meta-{i}" for _, i in self._sent.items()]
        for start in range(0, len(ids), 1000):
            self._redis.delete(*ids[start:start + 1000])
        self._redis.close()
        self.app.close()


class CeleryIntegration(_CeleryIntegration):
    """Celery on RabbitMQ (a vhost per run)."""

    name = "celery"

    def __init__(self, vhost: RabbitVhost, run_id: str) -> None:
        # Publisher confirms (py-amqp ``confirm_publish``): a publish that returned is on the
        # broker, so neither the producer's sends nor the workers' retries vanish in a
        # connection the broker is closing.
        super().__init__(vhost.url(), run_id, {"confirm_publish": True})
        self.vhost = vhost

    def broker_fault(self, workers: Workers) -> str:
        return f"{self.vhost.close_connections()} connections closed"

    def diagnose(self) -> str:
        """The run's queues, and every channel of the vhost (prefetch, unacked) with its
        consumers: which connection holds what a stalled drain waits for."""
        queues = rabbitmqctl("list_queues", "-p", self.vhost.name, "name", "messages_ready",
                             "messages_unacknowledged", "consumers")
        channels = [line for line in rabbitmqctl(
            "list_channels", "name", "vhost", "number", "consumer_count", "prefetch_count",
            "messages_unacknowledged", "messages_unconfirmed").splitlines()
            if f"\t{self.vhost.name}\t" in line]
        consumers = rabbitmqctl("list_consumers", "-p", self.vhost.name, "queue_name",
                                "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                                "active")
        return "\n".join([queues, "channels:", *channels, "consumers:", consumers,
                          *self._backend_states()])


class CeleryRedisIntegration(_CeleryIntegration):
    """Celery on the Redis broker (a private ``redis-server``), with slow keys that outlive
    the visibility timeout."""

    name = "celery-redis"

    def __init__(self, broker: PrivateRedis, run_id: str, slow_keys: list[str]) -> None:
        super().__init__(broker.url, run_id, dict(REDIS_TRANSPORT))
        self.broker, self.slow_keys = broker, slow_keys
        self.resent: list[str] = []
        self._suspects: set[str] = set()

    def worker_config(self, base: WorkerConfig) -> WorkerConfig:
        return replace(super().worker_config(base), slow_keys=self.slow_keys,
                       slow_seconds=SLOW_SECONDS)

    def broker_fault(self, workers: Workers) -> str:
        return f"{self.broker.drop_clients()} broker connections dropped"

    def diagnose(self) -> str:
        with redis.Redis.from_url(self.broker.url) as client:
            return (f"queue {self.queue}: {client.llen(self.queue)} waiting, "
                    f"{client.hlen('unacked')} unacked")

    def resend_lost(self, workdir: Path) -> int:
        """Resend the deliveries the transport lost (module docstring); returns how many."""
        answers = self.results()
        unanswered = {i: d for d, i in self._sent.items() if i not in answers}
        if not unanswered:
            return 0
        received = _last_message_received(workdir)
        held = self._held()
        lost = {i for i in unanswered
                if not received.get(i, False) and not any(i in raw for raw in held)}
        confirmed, self._suspects = lost & self._suspects, lost - self._suspects
        for task_id in sorted(confirmed):
            delivery = unanswered[task_id]
            self.app.send_task(
                OPERATIONS[delivery.profile], args=(delivery.key,), queue=self.queue,
                task_id=task_id,
                headers={"idempotency_key": delivery.key, "idempotency_tenant": TENANT},
            )
            self.resent.append(task_id)
        return len(confirmed)

    def _held(self) -> list[str]:
        """Every message the broker holds for the run: queued (any priority) or unacked."""
        with redis.Redis.from_url(self.broker.url, decode_responses=True) as client:
            raw: list[str] = list(client.hvals("unacked"))
            for name in client.scan_iter(match=f"{self.queue}*"):
                if client.type(name) == "list":
                    raw.extend(client.lrange(name, 0, -1))
        return raw

    def figures(self, workdir: Path) -> dict[str, Any]:
        """Deliveries of a slow key that arrived while one of its executions ran (the
        ``visibility_timeout`` redelivering a running task), and redeliveries in all."""
        deliveries: list[tuple[str, bool, float]] = []
        windows: dict[str, list[tuple[float, float]]] = {}
        for line in _log_lines(workdir):
            if m := _DELIVERY.search(line):
                deliveries.append((m[2], m[3] == "True", float(m[4])))
            elif m := _SLOW.search(line):
                windows.setdefault(m[1], []).append((float(m[2]), float(m[3])))
        while_running = [
            key for key, redelivered, at in deliveries
            if redelivered and any(start < at < end for start, end in windows.get(key, []))
        ]
        return {"visibility_redeliveries_while_running": len(while_running),
                "slow_keys_redelivered_while_running": len(set(while_running)),
                "redeliveries": sum(1 for _, redelivered, _ in deliveries if redelivered),
                "broker_losses_resent": len(self.resent),
                "broker_losses": [(i, self.published_at(i)) for i in self.resent],
                "slow_keys": len(self.slow_keys)}


def _last_message_received(workdir: Path) -> dict[str, bool]:
    """Task id -> whether its latest message reached a worker (False: a retry was published
    after its last delivery; absent: never delivered)."""
    events: dict[str, tuple[float, bool]] = {}
    for line in _log_lines(workdir):
        if m := _DELIVERY.search(line):
            task_id, at, received = m[1], float(m[4]), True
        elif m := _RETRY.search(line):
            task_id, at, received = m[1], float(m[2]), False
        else:
            continue
        if task_id not in events or at >= events[task_id][0]:
            events[task_id] = (at, received)
    return {task_id: received for task_id, (_, received) in events.items()}


def _log_lines(workdir: Path) -> list[str]:
    lines: list[str] = []
    for log in sorted(workdir.glob("worker-*.log")):
        lines.extend(log.read_text(errors="replace").splitlines())
    return lines
