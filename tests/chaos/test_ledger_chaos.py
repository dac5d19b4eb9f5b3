"""The ledger chaos test, once per integration (see ``_harness.py`` for what is asserted).

``CHAOS_PROFILE=ci`` (default, part of every ``pytest`` run), ``broker`` (eight broker faults) or
``long`` (``make chaos``); ``CHAOS_SEED`` replays a run's random choices (the seed is printed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._services import require

from ._celery import CeleryIntegration, CeleryRedisIntegration
from ._faults import PrivateRedis, RabbitVhost
from ._harness import ChaosEnv, run_chaos
from ._integrations import DramatiqIntegration, DramatiqStepsIntegration, KafkaIntegration
from ._profile import current_profile

# No re-run: a run that fails is a finding (docs/guarantees.md).
SLOW_KEYS = 2  # per ledger profile, in the Redis-broker run
pytestmark = [pytest.mark.chaos, pytest.mark.postgres,
              pytest.mark.timeout(current_profile().timeout)]


@pytest.fixture
def celery_integration(rabbit_vhost: RabbitVhost, chaos_env: ChaosEnv
                       ) -> Iterator[CeleryIntegration]:
    integration = CeleryIntegration(rabbit_vhost, chaos_env.run_id)
    try:
        yield integration
    finally:
        integration.close()


@pytest.fixture
def celery_redis_integration(chaos_env: ChaosEnv, tmp_path: Path
                             ) -> Iterator[CeleryRedisIntegration]:
    require("redis")  # the result backend
    (tmp_path / "broker").mkdir()
    broker = PrivateRedis(tmp_path / "broker")
    broker.start()
    crash = {k for keys in chaos_env.crash_keys.values() for k in keys}
    slow = [k for keys in chaos_env.keys.values()
            for k in chaos_env.rng.sample([k for k in keys if k not in crash], SLOW_KEYS)]
    integration = CeleryRedisIntegration(broker, chaos_env.run_id, slow)
    try:
        yield integration
    finally:
        integration.close()
        broker.stop()


@pytest.fixture
def dramatiq_integration(rabbit_vhost: RabbitVhost, chaos_env: ChaosEnv
                         ) -> Iterator[DramatiqIntegration]:
    integration = DramatiqIntegration(rabbit_vhost, chaos_env.run_id)
    try:
        yield integration
    finally:
        integration.close()


@pytest.fixture
def kafka_integration(kafka_bootstrap: str, chaos_env: ChaosEnv, tmp_path: Path
                      ) -> Iterator[KafkaIntegration]:
    integration = KafkaIntegration(kafka_bootstrap, chaos_env.run_id, tmp_path)
    try:
        yield integration
    finally:
        integration.close()


@pytest.mark.rabbitmq
def test_celery_ledger_under_chaos(celery_integration: CeleryIntegration,
                                   chaos_env: ChaosEnv) -> None:
    run_chaos(celery_integration, chaos_env)


@pytest.mark.redis
def test_celery_redis_broker_ledger_under_chaos(celery_redis_integration: CeleryRedisIntegration,
                                                chaos_env: ChaosEnv) -> None:
    """Celery on the Redis broker: kills, freezes and dropped broker connections, plus slow
    keys that run past ``visibility_timeout`` and are delivered again while they run."""
    summary = run_chaos(celery_redis_integration, chaos_env)
    # the fault happened: a slow key was delivered again while one of its executions ran (not
    # every slow key always is: once a copy is acked, kombu drops the entry the running
    # original shares with it, see docs/celery.md)
    assert summary["slow_keys_redelivered_while_running"] >= 1, summary
    # kombu's BRPOP-then-unacked window loses a message only when a worker dies or its broker
    # connection drops in it (see _celery.py): never more losses than such faults
    deaths = summary["kills"] + summary["body_crashes"] + summary["broker_faults"]
    assert summary["broker_losses_resent"] <= deaths, summary


@pytest.mark.rabbitmq
def test_dramatiq_ledger_under_chaos(dramatiq_integration: DramatiqIntegration,
                                     chaos_env: ChaosEnv) -> None:
    run_chaos(dramatiq_integration, chaos_env)


@pytest.mark.rabbitmq
def test_dramatiq_steps_ledger_under_chaos(rabbit_vhost: RabbitVhost,
                                           chaos_env: ChaosEnv) -> None:
    """The plain ledger body as a recorded step with a downstream key
    (``ctx.derived_key("ledger")`` under a unique constraint): the same faults, no double."""
    integration = DramatiqStepsIntegration(rabbit_vhost, chaos_env.run_id)
    try:
        summary = run_chaos(integration, chaos_env)
    finally:
        integration.close()
    assert summary["ledger"]["plain"]["doubles"] == 0, summary


@pytest.mark.kafka
def test_kafka_ledger_under_chaos(kafka_integration: KafkaIntegration,
                                  chaos_env: ChaosEnv) -> None:
    run_chaos(kafka_integration, chaos_env)
