"""The ledger chaos run, shared by every integration.

A producer publishes each logical operation (a unique key) once, and a fraction of them two or
three times (producer retries, some while the first copy still runs, some after it finished),
through the integration's real broker.  Worker subprocesses execute a body that writes one
ledger row per execution (``_body.py``).  Meanwhile a fault driver fires, at ledger-progress
thresholds spread over the run (so every planned fault happens while work is in flight):
SIGKILLs of random workers (restarted at once), SIGSTOP/SIGCONT longer than the lease, broker
connection faults, a PostgreSQL restart and a Redis (cache) outage.  A sampler reads the retry
counters all along.  At the end the run drains, waits for every lease to expire, runs
``recover_stuck_records()``, drains again and checks (``_verdict.py``), per ledger profile
(docs/guarantees.md):

* ``transactional`` — exactly one ledger row per operation: 0 doubles, 0 losses;
* ``plain`` — 0 losses; every double is explained by a counted retry of that scope
  (``rows(key) - 1 <= retry_count(key)``), never by a duplicate delivery;
* both — every record SUCCESS (none left PROCESSING) and its response is the result of one of
  the key's ledger rows (the only one, for ``transactional``); every delivery's result is that
  response (``plain`` only: or, for a doubled key, the result of the stale execution that lost
  its lease); retry counters never decreased.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from idempotent_tasks import IdempotencyHandler, Status

from ._body import OPERATIONS, TENANT, WorkerConfig
from ._faults import PrivateRedis, Workers, wait_until, wall_clock
from ._ledger import Ledger
from ._profile import Profile
from ._verdict import LEDGER_PROFILES, RunFacts, check, report, summarize


@dataclass(frozen=True)
class Delivery:
    profile: str  # "transactional" | "plain"
    key: str
    copy: int  # 0 = the first send; 1, 2 = producer retries


class Integration(Protocol):
    """What the harness needs from one integration (Celery, Dramatiq, Kafka)."""

    name: str
    stop_seconds: float  # how long a "stop" fault freezes a worker

    def worker_command(self) -> list[str]: ...

    def worker_config(self, base: WorkerConfig) -> WorkerConfig: ...

    def publish(self, delivery: Delivery) -> None: ...

    def flush(self) -> None: ...

    def broker_fault(self, workers: Workers) -> str:
        """Break the broker connections (verified); returns the evidence."""
        ...

    def sent(self) -> list[tuple[Delivery, str]]: ...

    def results(self) -> dict[str, list[Any]]:
        """Delivery id -> every result that delivery was answered with (fresh or replayed)."""
        ...

    def diagnose(self) -> str:
        """The broker's view of the run (queue depths), for a drain that stalled."""
        ...

    def published_at(self, delivery_id: str) -> str:
        """When the delivery was published (wall clock, as the worker logs print it)."""
        ...

    def figures(self, workdir: Path) -> dict[str, Any]:
        """Figures of the integration's own faults (e.g. visibility-timeout redeliveries)."""
        ...

    def resend_lost(self, workdir: Path) -> int:
        """Resend what the broker itself provably lost (only the Redis broker can); returns
        how many deliveries were resent."""
        ...


class Database(Protocol):
    """The run's database server, which the ``pg_restart`` fault restarts (the private
    PostgreSQL cluster, or another suite's private server)."""

    def restart(self) -> object:
        """Restart it, verified (``FaultNotVerified`` otherwise); returns the evidence."""
        ...

    def ensure_running(self) -> None: ...


@dataclass
class ChaosEnv:
    """What the fixtures provide to a run."""

    profile: Profile
    run_id: str
    workdir: Path
    root: Path
    ledger: Ledger
    handler: IdempotencyHandler
    config: WorkerConfig
    redis: PrivateRedis
    database: Database
    rng: random.Random
    crash_keys: dict[str, list[str]]
    keys: dict[str, list[str]]


# -- the plan ----------------------------------------------------------------------------------
def make_keys(profile: Profile, rng: random.Random) -> dict[str, list[str]]:
    return {
        p: [f"{p[:2]}-{i:05d}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
            for i in range(profile.operations)]
        for p in LEDGER_PROFILES
    }


def plan_deliveries(
    keys: dict[str, list[str]], fraction: float, rng: random.Random
) -> list[Delivery]:
    """Every key once, a ``fraction`` of them 2-3 times; retries land up to ~60 sends after
    the first copy, so some race the first execution and some replay its result."""
    slots: list[tuple[float, Delivery]] = []
    for lane, (profile, profile_keys) in enumerate(keys.items()):
        for i, key in enumerate(profile_keys):
            position = 2 * i + lane
            slots.append((position, Delivery(profile, key, 0)))
            copies = rng.choice((2, 3)) if rng.random() < fraction else 1
            for copy in range(1, copies):
                slots.append((position + rng.uniform(0.5, 120), Delivery(profile, key, copy)))
    slots.sort(key=lambda slot: slot[0])
    return [d for _, d in slots]


def fault_plan(profile: Profile, rng: random.Random) -> list[tuple[float, str]]:
    """(fraction of the expected ledger rows, fault) pairs spread over 5-85 % of the run."""
    kinds = (["kill"] * profile.kills + ["stop"] * profile.stops
             + ["broker"] * profile.broker_faults + ["pg_restart"] * profile.pg_restarts
             + ["redis_stop"] * profile.redis_stops)
    rng.shuffle(kinds)
    n = len(kinds)
    return [(0.05 + 0.8 * (i + rng.uniform(0.1, 0.9)) / n, kind) for i, kind in enumerate(kinds)]


# -- the moving parts --------------------------------------------------------------------------
class Producer(threading.Thread):
    """Publishes the plan at a steady pace; a failed publish is retried (a producer retry)."""

    def __init__(self, integration: Integration, plan: list[Delivery], seconds: float) -> None:
        super().__init__(daemon=True)
        self.integration, self.plan, self.seconds = integration, plan, seconds
        self.publish_errors = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.monotonic()
            for i, delivery in enumerate(self.plan):
                pause = start + self.seconds * i / len(self.plan) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing: the rate of the producer, not a race
                self._publish(delivery)
            self.integration.flush()
        except BaseException as exc:
            self.error = exc

    def _publish(self, delivery: Delivery) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                self.integration.publish(delivery)
                return
            except Exception:
                self.publish_errors += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


class FaultDriver(threading.Thread):
    """Fires each planned fault once the ledger reaches its threshold.  A fault is counted
    only once it is verified (the ``_faults`` helpers raise ``FaultNotVerified`` otherwise,
    which ends the driver with an error and fails the run); its evidence goes into the
    timeline."""

    def __init__(self, integration: Integration, env: ChaosEnv, workers: Workers,
                 plan: list[tuple[float, str]]) -> None:
        super().__init__(daemon=True)
        self.integration, self.env, self.workers, self.plan = integration, env, workers, plan
        self.counts: dict[str, int] = {}
        self.timeline: list[tuple[float, str, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        expected_rows = self.env.profile.total_operations
        started = time.monotonic()
        gap = int(0.4 * 0.8 * expected_rows / max(1, len(self.plan)))
        last = 0
        try:
            for fraction, kind in self.plan:
                # at least `gap` rows of progress since the previous fault, so faults never
                # pile up while one of them (a stop, an outage) holds the driver
                threshold = min(max(int(fraction * expected_rows), last + gap),
                                int(0.9 * expected_rows))
                wait_until(partial(self._reached, threshold), self.env.profile.timeout,
                           f"{threshold} ledger rows before {kind}")
                last = self.env.ledger.count() or threshold
                at = wall_clock()
                evidence = f"{at}: {self._fire(kind)}"
                self.counts[kind] = self.counts.get(kind, 0) + 1
                self.timeline.append((round(time.monotonic() - started, 1), kind, evidence))
        except BaseException as exc:
            self.error = exc

    def _reached(self, rows: int) -> bool:
        return (self.env.ledger.count() or 0) >= rows

    def _fire(self, kind: str) -> str:
        """Fire one fault; returns its evidence (what was verified)."""
        lease = self.env.config.lease
        actions: dict[str, Callable[[], object]] = {
            "kill": lambda: f"pid {self.workers.kill_random()} gone",
            "stop": lambda: f"pid {self.workers.stop_random(self.integration.stop_seconds)} "
                            "stopped",
            "broker": lambda: self.integration.broker_fault(self.workers),
            "pg_restart": lambda: str(self.env.database.restart()),
            "redis_stop": lambda: self.env.redis.outage(lease) or "killed, refused, restarted",
        }
        return str(actions[kind]())


class CounterSampler(threading.Thread):
    """Reads every retry counter twice a second; a counter that went down is a violation."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(daemon=True)
        self.ledger = ledger
        self.last: dict[tuple[str, str], int] = {}
        self.samples = 0
        self.violations: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self.sample()

    def sample(self) -> None:
        now = self.ledger.counters_now()
        if now is None:
            return  # PostgreSQL restarting
        self.samples += 1
        for scope, before in self.last.items():
            after = now.get(scope)
            if after is None or after < before:
                self.violations.append(f"{scope}: {before} -> {after}")
        self.last = now


# -- the run -----------------------------------------------------------------------------------
def run_chaos(integration: Integration, env: ChaosEnv) -> dict[str, Any]:
    """Run, drain, recover, check; returns the summary (and asserts the guarantees)."""
    profile, rng = env.profile, env.rng
    plan = plan_deliveries(env.keys, profile.duplicate_fraction, rng)
    config = integration.worker_config(env.config)
    workers = Workers(
        integration.worker_command(), {**_base_env(env.root), "CHAOS_WORKER_CONFIG":
                                       config.to_env()},
        env.root, env.workdir, profile.workers, rng,
    )
    started = time.monotonic()
    workers.start()
    producer = Producer(integration, plan, profile.publish_seconds)
    driver = FaultDriver(integration, env, workers, fault_plan(profile, rng))
    sampler = CounterSampler(env.ledger)
    try:
        for thread in (producer, driver, sampler):
            thread.start()
        _join(producer, driver, profile.timeout)
        _drain(integration, env, workers, driver)
        recovered = _recover(env)
        _drain(integration, env, workers, driver)
        duration = time.monotonic() - started
        sampler.halt.set()
        sampler.join(5)
        sampler.sample()
        facts = _gather(integration, env, recovered)
    finally:
        sampler.halt.set()
        workers.close()
    summary = summarize(integration.name, env, facts, driver.counts, workers.restarts,
                        duration)
    summary.update(integration.figures(env.workdir))
    summary["fault_timeline"] = driver.timeline
    summary["producer_publish_errors"] = producer.publish_errors
    report(summary)
    check(facts, env, driver.counts, sampler.samples, sampler.violations,
          plain_steps=config.plain_steps)
    return summary


def _base_env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}


def _join(producer: Producer, driver: FaultDriver, timeout: float) -> None:
    for thread in (producer, driver):
        thread.join(timeout)
        assert not thread.is_alive(), f"{type(thread).__name__} did not finish"
    assert producer.error is None, f"the producer failed: {producer.error!r}"
    assert driver.error is None, f"the fault driver failed: {driver.error!r}"


def _drain(integration: Integration, env: ChaosEnv, workers: Workers,
           driver: FaultDriver) -> None:
    """Wait until every key's record is SUCCESS and every delivery has its result."""
    want = {OPERATIONS[p]: len(keys) for p, keys in env.keys.items()}
    sent = {delivery_id for _, delivery_id in integration.sent()}

    last_check = time.monotonic()

    def done() -> bool:
        nonlocal last_check
        counts = env.ledger.status_counts()
        results = integration.results()
        finished = all(counts.get((op, "SUCCESS"), 0) >= n for op, n in want.items()) and all(
            results.get(i) for i in sent)
        if not finished and time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            integration.resend_lost(env.workdir)
        return finished

    try:
        wait_until(done, env.profile.timeout / 2, "every scope SUCCESS and every delivery "
                   "answered", poll=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_stalled(integration, env)}\nfaults: {driver.timeline}"
                             f"\n{workers.log_tail()}") from exc


def _stalled(integration: Integration, env: ChaosEnv) -> str:
    """What a drain that timed out was waiting for: scopes not SUCCESS, deliveries unanswered,
    every worker log line that names them, and the broker's view of the run's queues."""
    lines, needles = [], []
    for p, keys in env.keys.items():
        for key in keys:
            record = env.handler.get_record(operation=OPERATIONS[p], tenant=TENANT, key=key)
            if record is None or record.status is not Status.SUCCESS:
                lines.append(f"scope {p}/{key}: {record}")
                needles.append(key)
    results = integration.results()
    for d, i in integration.sent():
        if not results.get(i):
            lines.append(f"unanswered delivery {d} id={i} published {integration.published_at(i)}")
            needles.append(i)
    lines = lines[:30]
    for log in sorted(env.workdir.glob("worker-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(n in line for n in needles[:30]):
                lines.append(f"{log.name}: {line[:300]}")
    lines.append(integration.diagnose())
    return "\n".join(lines)


def _recover(env: ChaosEnv) -> int:
    """After every lease expired: recovery must find nothing left to do (or release it)."""
    wait_until(lambda: env.ledger.live_leases(env.handler.clock()) == 0, 30,
               "every lease to expire")
    recovered = 0
    while (n := env.handler.recover_stuck_records()) > 0:
        recovered += n
    return recovered


def _gather(integration: Integration, env: ChaosEnv, recovered: int) -> RunFacts:
    records = {
        p: {k: env.handler.get_record(operation=OPERATIONS[p], tenant=TENANT, key=k)
            for k in keys}
        for p, keys in env.keys.items()
    }
    return RunFacts(
        rows=env.ledger.rows(), records=records, sent=integration.sent(),
        results=integration.results(), crashed=env.ledger.crashed_keys(), recovered=recovered,
        status_counts=env.ledger.status_counts(),
    )
