"""The outbox chaos profile: two hops, exactly once each, whatever is killed when.

Hop 1: ``outbox.charge`` (a transactional Celery task, ``tests/outbox/chaos_celery_app.py``)
writes a ``hop1`` ledger row and stages three follow-ups in the same transaction — a Celery
task, a Dramatiq message and a Kafka record.  Two ``idempotent-tasks relay`` processes (one
holds the leases, the other stands by) publish them.  Hop 2: three transactional receivers —
a Celery task, a Dramatiq actor, a Kafka consumer loop — each write their own ledger row,
deduplicating the relay's redeliveries (and the brokers') by the staged idempotency key.

The producer publishes every charge once and a fraction of them two or three times; while
it runs, faults fire at ledger-progress thresholds: SIGKILLs of the relays, the Celery
workers, the Dramatiq worker and the Kafka consumer (each restarted at once), the RabbitMQ
vhost's connections closed, and a restart of the suite's private PostgreSQL.  Every fault is
verified before it counts (``_faults.py``).  At the end: every charge has exactly one row per
hop — 0 doubles, 0 lost on both hops — every record is SUCCESS, and every staged row SENT.

``CHAOS_PROFILE=ci`` (default, a couple of minutes) or ``long``; ``CHAOS_SEED`` replays.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, SQLStore, Status
from idempotent_tasks.outbox import Outbox, RowStatus
from tests._private_postgres import FaultNotVerified, PrivatePostgres
from tests.outbox._chaos_config import (
    AUDIT,
    CAPTURE,
    CHARGE,
    ENV,
    HOPS,
    SHIP,
    TENANT,
    ChaosConfig,
)

from ._faults import RabbitVhost, Workers, group_states, wait_until
from ._harness import ChaosEnv
from ._profile import current_profile
from ._verdict import report

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class OutboxProfile:
    operations: int
    duplicate_fraction: float
    publish_seconds: float
    faults: dict[str, int]  # fault -> how many
    timeout: float


PROFILES = {
    "ci": OutboxProfile(operations=300, duplicate_fraction=0.3, publish_seconds=40.0,
                        faults={"kill_relay": 2, "kill_celery": 2, "kill_dramatiq": 1,
                                "kill_kafka": 1, "broker": 1, "pg_restart": 1}, timeout=300.0),
    "long": OutboxProfile(operations=3000, duplicate_fraction=0.3, publish_seconds=240.0,
                          faults={"kill_relay": 8, "kill_celery": 8, "kill_dramatiq": 4,
                                  "kill_kafka": 4, "broker": 4, "pg_restart": 2},
                          timeout=1800.0),
}
PROFILE = PROFILES["long" if current_profile().name == "long" else "ci"]
pytestmark = [pytest.mark.chaos, pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.kafka,
              pytest.mark.timeout(PROFILE.timeout)]


class Fleet:
    """The run's processes, one ``Workers`` group per role."""

    def __init__(self, cfg: ChaosConfig, env: ChaosEnv, bootstrap: str) -> None:
        base = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                ENV: cfg.to_env()}
        py = sys.executable
        cli = str(Path(py).parent / "idempotent-tasks")
        relay = [cli, "--store", cfg.store_url, "--prefix",
                 cfg.prefix, "--log-level", "info", "relay",
                 "--celery-app", "tests.outbox.chaos_celery_app:app",
                 "--dramatiq-broker", "tests.outbox.chaos_dramatiq_app:broker",
                 "--kafka", bootstrap, "--poll-interval", "0.5", "--lease-ttl", "4",
                 "--batch-size", "200"]
        celery = [py, "-m", "celery", "-A", "tests.outbox.chaos_celery_app", "worker",
                  "--pool", "threads", "--concurrency", "4", "--without-gossip",
                  "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
                  "-Q", f"{cfg.charge_queue},{cfg.capture_queue}"]
        dramatiq_ = [py, "-m", "dramatiq", "tests.outbox.chaos_dramatiq_app", "--processes",
                     "1", "--threads", "4"]
        kafka = [py, "-m", "tests.outbox.chaos_kafka_worker"]
        self.groups: dict[str, Workers] = {}
        for name, command, count in (("relay", relay, 2), ("celery", celery, 2),
                                     ("dramatiq", dramatiq_, 1), ("kafka", kafka, 1)):
            logs = env.workdir / name
            logs.mkdir()
            self.groups[name] = Workers(command, base, ROOT, logs, count, env.rng)

    def start(self) -> None:
        for group in self.groups.values():
            group.start()

    def close(self) -> None:
        for group in self.groups.values():
            group.close()

    @property
    def restarts(self) -> int:
        return sum(g.restarts for g in self.groups.values())

    def log_tail(self) -> str:
        return "\n".join(f"=== {name}\n{g.log_tail(1500)}" for name, g in self.groups.items())


def _plan(keys: list[str], fraction: float, rng: random.Random) -> list[str]:
    slots = []
    for i, key in enumerate(keys):
        slots.append((float(i), key))
        if rng.random() < fraction:
            slots += [(i + rng.uniform(0.5, 40), key) for _ in range(rng.choice((1, 2)))]
    return [key for _, key in sorted(slots)]


class Producer(threading.Thread):
    """Sends the charges at a steady pace (a failed send is sent again: a producer retry)."""

    def __init__(self, cfg: ChaosConfig, plan: list[str], seconds: float) -> None:
        super().__init__(daemon=True)
        from celery import Celery

        self.app = Celery("outbox-chaos-producer", broker=cfg.broker_url, set_as_current=False)
        self.app.conf.update(broker_transport_options={"confirm_publish": True},
                             broker_connection_retry_on_startup=True)
        self.cfg, self.plan, self.seconds = cfg, plan, seconds
        self.errors = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.monotonic()
            for i, key in enumerate(self.plan):
                pause = start + self.seconds * i / len(self.plan) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing: the producer's rate, not a race
                self._send(key)
        except BaseException as exc:
            self.error = exc

    def _send(self, key: str) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                self.app.send_task(CHARGE, args=(key,), queue=self.cfg.charge_queue,
                                   headers={"idempotency_key": key,
                                            "idempotency_tenant": TENANT})
                return
            except Exception:
                self.errors += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _kill_group(pid: int) -> None:
    """SIGKILL a worker's process group (its ``Workers`` monitor starts another one);
    verified: nothing of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not group_states(pid), 10, f"process group {pid} to die")


class Faults(threading.Thread):
    """Fires each planned fault once the ledger reaches its threshold (5-85 % of the rows)."""

    def __init__(self, env: ChaosEnv, fleet: Fleet, vhost: RabbitVhost, postgres: Any,
                 expected: int) -> None:
        super().__init__(daemon=True)
        kinds = [k for k, n in PROFILE.faults.items() for _ in range(n)]
        env.rng.shuffle(kinds)
        self.plan = [(0.05 + 0.8 * (i + env.rng.uniform(0.1, 0.9)) / len(kinds), kind)
                     for i, kind in enumerate(kinds)]
        self.env, self.fleet, self.vhost, self.expected = env, fleet, vhost, expected
        self.postgres = postgres
        self.counts: dict[str, int] = {}
        self.timeline: list[tuple[float, str, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            for fraction, kind in self.plan:
                rows = int(fraction * self.expected)
                wait_until(lambda rows=rows: (self.env.ledger.count() or 0) >= rows,
                           PROFILE.timeout, f"{rows} ledger rows before {kind}")
                evidence = self._fire(kind)
                self.counts[kind] = self.counts.get(kind, 0) + 1
                self.timeline.append((round(time.monotonic() - started, 1), kind, evidence))
        except BaseException as exc:
            self.error = exc

    def _fire(self, kind: str) -> str:
        groups = self.fleet.groups
        actions: dict[str, Callable[[], str]] = {
            "kill_relay": self._kill_relay,
            "kill_celery": lambda: f"celery pid {groups['celery'].kill_random()} killed",
            "kill_dramatiq": lambda: f"dramatiq pid {groups['dramatiq'].kill_random()} killed",
            "kill_kafka": lambda: f"kafka pid {groups['kafka'].kill_random()} killed",
            "broker": lambda: f"{self.vhost.close_connections()} connections closed",
            "pg_restart": lambda: str(self.postgres.restart()),
        }
        return actions[kind]()

    def _kill_relay(self) -> str:
        """Kill the relay that holds the Celery lease (the one publishing), not the standby.
        After an earlier kill the dead relay's lease lives on for its ttl: wait for a live
        relay to hold it."""
        sql = (f"SELECT owner FROM {self.env.config.prefix}_locks "
               "WHERE name = 'idempotency.outbox.celery'")
        holder: list[int] = []

        def held_by_a_live_relay() -> bool:  # None: a connection a restart broke; ask again
            rows = self.env.ledger.db.query(sql) or []
            live = {p.pid for p in self.fleet.groups["relay"].procs if p.poll() is None}
            holder[:] = [int(r[0].split(":")[1]) for r in rows if int(r[0].split(":")[1]) in live]
            return bool(holder)

        try:
            wait_until(held_by_a_live_relay, 30, "a live relay holding the Celery lease")
        except AssertionError as exc:
            raise FaultNotVerified(str(exc)) from exc
        _kill_group(holder[0])
        return f"lease holder relay pid {holder[0]} killed"


@pytest.fixture
def outbox_run(chaos_env: ChaosEnv, rabbit_vhost: RabbitVhost, kafka_bootstrap: str
               ) -> Iterator[tuple[ChaosConfig, Fleet]]:
    from tests.consumers.conftest import create_topic

    run = chaos_env.run_id
    cfg = ChaosConfig(
        store_url=chaos_env.config.store_url, prefix=chaos_env.config.prefix,
        ledger=chaos_env.ledger.table, broker_url=rabbit_vhost.url(),
        charge_queue=f"charge-{run}", capture_queue=f"capture-{run}", ship_queue=f"ship-{run}",
        kafka={"bootstrap.servers": kafka_bootstrap, "session.timeout.ms": 6000,
               "heartbeat.interval.ms": 500},
        topic=create_topic(kafka_bootstrap, 2, "outbox-chaos"), group=f"outbox-{run}",
        lease=chaos_env.config.lease, heartbeat=chaos_env.config.heartbeat,
    )
    fleet = Fleet(cfg, chaos_env, kafka_bootstrap)
    try:
        yield cfg, fleet
    finally:
        fleet.close()
        _delete_topic(kafka_bootstrap, cfg.topic)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    with contextlib.suppress(Exception):
        for future in AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic]).values():
            future.result(15)


def test_outbox_two_hop_ledger_under_chaos(outbox_run: tuple[ChaosConfig, Fleet],
                                           chaos_env: ChaosEnv, rabbit_vhost: RabbitVhost,
                                           private_postgres: PrivatePostgres) -> None:
    cfg, fleet = outbox_run
    env = chaos_env
    keys = [f"ob-{i:05d}-{uuid.UUID(int=env.rng.getrandbits(128)).hex[:10]}"
            for i in range(PROFILE.operations)]
    plan = _plan(keys, PROFILE.duplicate_fraction, env.rng)
    expected = len(keys) * len(HOPS)
    started = time.monotonic()
    fleet.start()
    producer = Producer(cfg, plan, PROFILE.publish_seconds)
    faults = Faults(env, fleet, rabbit_vhost, private_postgres, expected)
    producer.start()
    faults.start()
    for thread in (producer, faults):
        thread.join(PROFILE.timeout)
    assert producer.error is None, f"the producer failed: {producer.error!r}"
    assert faults.error is None, f"a fault failed: {faults.error!r}\n{fleet.log_tail()}"
    rows = _drained(env, keys, fleet)
    summary = _summary(env, keys, plan, rows, faults, fleet, time.monotonic() - started)
    summary["producer_publish_errors"] = producer.errors
    report(summary)
    _check(env, cfg, keys, rows, faults)


def _drained(env: ChaosEnv, keys: list[str], fleet: Fleet) -> dict[str, dict[str, list[str]]]:
    """Wait until every charge has a row on every hop (or the deadline: then report)."""
    unsent = f"SELECT count(*) FROM {env.config.prefix}_outbox WHERE status <> 'SENT'"

    def done() -> bool:
        try:
            rows = env.ledger.rows()
        except AssertionError:  # a query on a connection the restart broke: ask again
            return False
        if not all(rows.get(hop, {}).get(key) for hop in HOPS for key in keys):
            return False
        left = env.ledger.db.query(unsent)  # None while PostgreSQL restarts
        return left is not None and int(left[0][0]) == 0

    try:
        wait_until(done, PROFILE.timeout / 2, "a ledger row per charge on every hop", poll=0.5)
    except AssertionError as exc:
        rows = env.ledger.rows()
        missing = [(hop, key) for hop in HOPS for key in keys if not rows.get(hop, {}).get(key)]
        left = env.ledger.db.query(f"SELECT status, kind, count(*) FROM {env.config.prefix}"
                                   "_outbox GROUP BY status, kind")
        raise AssertionError(f"{exc}: {len(missing)} missing, e.g. {missing[:10]}; outbox "
                             f"{left}\n{fleet.log_tail()}") from exc
    return env.ledger.rows()


def _summary(env: ChaosEnv, keys: list[str], plan: list[str],
             rows: dict[str, dict[str, list[str]]], faults: Faults, fleet: Fleet,
             duration: float) -> dict[str, Any]:
    """The chaos suite's summary table, one line per hop (integration column: ``outbox``)."""
    per_hop = {}
    for hop in HOPS:
        counts = [len(rows.get(hop, {}).get(k, [])) for k in keys]
        per_hop[hop] = {
            "operations": len(keys), "deliveries": len(plan) if hop == "hop1" else "-",
            "duplicate_deliveries": len(plan) - len(keys) if hop == "hop1" else "-",
            "scopes_retried": "-", "doubles": sum(max(0, n - 1) for n in counts),
            "explained_doubles": 0, "lost": sum(1 for n in counts if n == 0),
        }
    c = faults.counts
    return {
        "integration": "outbox", "profile": current_profile().name, "run_id": env.run_id,
        "kills": sum(v for k, v in c.items() if k.startswith("kill")), "stops": 0,
        "broker_faults": c.get("broker", 0), "pg_restarts": c.get("pg_restart", 0),
        "redis_stops": 0, "body_crashes": 0, "worker_restarts": fleet.restarts,
        "recovered_at_end": 0, "duration_s": round(duration, 1), "ledger": per_hop,
        "fault_timeline": faults.timeline, "faults": dict(c),
    }


def _check(env: ChaosEnv, cfg: ChaosConfig, keys: list[str],
           rows: dict[str, dict[str, list[str]]], faults: Faults) -> None:
    assert faults.counts == PROFILE.faults, faults.counts
    problems = [f"{hop} {key}: {len(rows.get(hop, {}).get(key, []))} rows"
                for hop in HOPS for key in keys if len(rows.get(hop, {}).get(key, [])) != 1]
    assert not problems, f"{len(problems)} keys without exactly one row: {problems[:20]}"
    store = SQLStore(cfg.store_url, table_prefix=cfg.prefix)
    try:
        handler = IdempotencyHandler(store, metrics=None)
        staged = Outbox(store).rows(limit=10 * len(keys))
        assert len(staged) == 3 * len(keys), len(staged)
        assert {r.status for r in staged} == {RowStatus.SENT}, json.dumps(
            [r._asdict() for r in staged if r.status is not RowStatus.SENT][:5], default=str)
        for key in keys:
            record = handler.get_record(operation=CHARGE, tenant=TENANT, key=key)
            assert record is not None and record.status is Status.SUCCESS, (key, record)
        for row in staged:
            operation = {"celery": CAPTURE, "dramatiq": SHIP, "kafka": AUDIT}[row.kind]
            record = handler.get_record(operation=operation, tenant=TENANT, key=row.key)
            assert record is not None and record.status is Status.SUCCESS, (row.kind, record)
    finally:
        store.close()
