"""Fixtures of the chaos suite: a fresh store, ledger and private Redis per run, a RabbitMQ
vhost per run, the session's Tansu broker and the session's private PostgreSQL cluster (the
one the runs restart; always left running)."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, SQLStore
from tests._private_postgres import PrivatePostgres
from tests._services import IN_CI, require
from tests.consumers.conftest import kafka_bootstrap  # noqa: F401  (the session's Tansu)

from ._body import WorkerConfig
from ._faults import PrivateRedis, RabbitVhost
from ._harness import ChaosEnv, make_keys
from ._integrations import new_run_id
from ._ledger import Ledger
from ._profile import current_profile
from ._seeds import replay_command, resolve, seed_params
from ._verdict import SUMMARIES, format_summary

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3.0
HEARTBEAT = 1.0
MAX_RETRIES = 50  # faults (PostgreSQL down, crashes) count attempts; none may poison a key


def _require_binary(name: str) -> None:
    if shutil.which(name) is None:
        message = f"{name} is not installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that takes ``chaos_seed`` runs on its kept regression seeds and a fresh one
    (``_seeds.py``)."""
    if "chaos_seed" in metafunc.fixturenames:
        metafunc.parametrize("chaos_seed", seed_params(metafunc.function.__name__),
                             indirect=True, ids=lambda p: f"seed-{p}")


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """This run's seed; a failure report names it with the command that replays it."""
    seed = resolve(request.param)
    request.node.chaos_seed = seed
    print(f"chaos seed: CHAOS_SEED={seed}")
    return seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "chaos_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("chaos replay", f"seed {seed}; replay with:\n"
                                f"  {replay_command(item.nodeid, seed)}"))


@pytest.fixture
def chaos_env(tmp_path: Path, private_postgres: PrivatePostgres, chaos_seed: int
              ) -> Iterator[ChaosEnv]:
    _require_binary("redis-server")
    pg = private_postgres
    pg.ensure_running()
    profile = current_profile()
    rng = random.Random(chaos_seed)
    run_id = new_run_id()
    prefix = f"chaos_{run_id}"
    store = SQLStore(pg.url, table_prefix=prefix)
    store.create_schema()
    ledger = Ledger(run_id, prefix, pg.dsn)
    ledger.create()
    cache = PrivateRedis(tmp_path)
    cache.start()
    keys = make_keys(profile, rng)
    crash_keys = {p: rng.sample(k, profile.crash_keys) for p, k in keys.items()}
    config = WorkerConfig(
        store_url=pg.url, dsn=pg.dsn, prefix=prefix, ledger=ledger.table,
        crash_table=ledger.crash_table, cache_url=cache.url, lease=LEASE, heartbeat=HEARTBEAT,
        max_retries=MAX_RETRIES, crash_keys=[k for ks in crash_keys.values() for k in ks],
    )
    handler = IdempotencyHandler(store, metrics=None, lease_timeout=LEASE,
                                 max_retries=MAX_RETRIES)
    env = ChaosEnv(profile, run_id, tmp_path, ROOT, ledger, handler, config, cache, pg, rng,
                   crash_keys, keys)
    try:
        yield env
    finally:
        cache.stop()
        pg.ensure_running()
        ledger.drop()
        store.drop_schema()
        store.close()


@pytest.fixture
def rabbit_vhost() -> Iterator[RabbitVhost]:
    require("rabbitmq")
    require("redis")  # the result backends
    _require_binary("rabbitmqctl")
    vhost = RabbitVhost(f"chaos-{new_run_id()}")
    vhost.create()
    try:
        yield vhost
    finally:
        vhost.delete()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not SUMMARIES:
        return
    terminalreporter.section("chaos summary")
    for summary in SUMMARIES:
        terminalreporter.write_line(format_summary(summary))
        terminalreporter.write_line("")
