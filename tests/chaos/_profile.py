"""Chaos profiles: one code path, three sizes (``CHAOS_PROFILE=ci|broker|long``, default ``ci``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

PROFILE_ENV = "CHAOS_PROFILE"


@dataclass(frozen=True)
class Profile:
    """How big a run is and how many faults it gets.  Counts of faults are guaranteed: the
    harness fires them at ledger-progress thresholds spread over the run."""

    name: str
    operations: int  # per ledger profile (transactional and plain each get this many keys)
    duplicate_fraction: float  # share of operations the producer sends 2-3 times
    workers: int
    kills: int
    stops: int  # SIGSTOP ... SIGCONT of a worker, longer than the lease
    broker_faults: int  # RabbitMQ: close our vhost's connections; Kafka: stop past the session
    pg_restarts: int
    redis_stops: int
    crash_keys: int  # per ledger profile: first execution kills its worker after the effect
    publish_seconds: float  # the producer spreads its deliveries over this long
    timeout: float  # pytest-timeout for one integration's test

    @property
    def total_operations(self) -> int:
        return 2 * self.operations


PROFILES = {
    "ci": Profile(
        name="ci", operations=550, duplicate_fraction=0.3, workers=3, kills=6, stops=2,
        broker_faults=1, pg_restarts=1, redis_stops=1, crash_keys=3, publish_seconds=30.0,
        timeout=300.0,
    ),
    # The CI profile with eight broker-connection faults instead of one: how the Dramatiq
    # drain stall was reproduced (docs/guarantees.md).
    "broker": Profile(
        name="broker", operations=550, duplicate_fraction=0.3, workers=3, kills=6, stops=2,
        broker_faults=8, pg_restarts=1, redis_stops=1, crash_keys=3, publish_seconds=30.0,
        timeout=300.0,
    ),
    "long": Profile(
        name="long", operations=10_000, duplicate_fraction=0.3, workers=4, kills=60, stops=10,
        broker_faults=6, pg_restarts=2, redis_stops=3, crash_keys=15, publish_seconds=360.0,
        timeout=3600.0,
    ),
}


def current_profile() -> Profile:
    name = os.environ.get(PROFILE_ENV, "ci")
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV} must be one of {sorted(PROFILES)}, not {name!r}")
    return PROFILES[name]
