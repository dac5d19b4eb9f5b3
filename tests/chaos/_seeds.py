"""Which seeds a chaos test runs with, and how a failed run says how to replay it.

Every chaos test takes the ``chaos_seed`` fixture.  Without ``CHAOS_SEED`` it runs once per
seed in :data:`REGRESSION_SEEDS` for that test (seeds that once failed, kept so the fault they
found stays fixed) and once with a fresh random seed; with ``CHAOS_SEED=N`` it runs only with
``N``.  A failed run's report names its seed and the command that replays it.
"""

from __future__ import annotations

import os
import random

SEED_ENV = "CHAOS_SEED"
FRESH = "fresh"

#: test name -> seeds that once failed it (why, in the comment beside each).
REGRESSION_SEEDS: dict[str, tuple[int, ...]] = {
    # The run's last fault was the PostgreSQL restart; the drain's first ledger query after it
    # met the connection the restart had closed, and the harness took that for an outage.
    "test_kafka_ledger_under_chaos": (345994024,),
}


def seed_params(test_name: str) -> list[int | str]:
    """The ``chaos_seed`` parameters of one test: the kept seeds, then a fresh one."""
    chosen = os.environ.get(SEED_ENV)
    if chosen:
        return [int(chosen)]
    return [*REGRESSION_SEEDS.get(test_name, ()), FRESH]


def resolve(param: int | str) -> int:
    """A parameter as a seed: a fresh one is drawn (and printed by the fixture)."""
    return random.randrange(1 << 30) if param == FRESH else int(param)


def replay_command(nodeid: str, seed: int) -> str:
    """The shell command that replays one run with the same random choices."""
    base = nodeid.split("[", 1)[0]
    profile = os.environ.get("CHAOS_PROFILE", "ci")
    return f"CHAOS_PROFILE={profile} {SEED_ENV}={seed} .venv/bin/pytest '{base}'"
