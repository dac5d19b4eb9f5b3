"""The ledger chaos test, once per integration (see ``_harness.py`` for what is asserted).

``CHAOS_PROFILE=ci`` (default, part of every ``pytest`` run) or ``long`` (``make chaos``);
``CHAOS_SEED`` replays a run's random choices (the seed is printed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._faults import RabbitVhost
from ._harness import ChaosEnv, run_chaos
from ._integrations import CeleryIntegration, DramatiqIntegration, KafkaIntegration
from ._profile import current_profile

# One re-run of a whole chaos run that fails: roughly one run in six stalled its final drain
# (a delivery never answered) on this shared 2-core machine, not yet root-caused (see
# docs/guarantees.md).  Both attempts must fail for the test to fail; every assertion of a
# run that completes is still enforced in full.
pytestmark = [pytest.mark.chaos, pytest.mark.postgres,
              pytest.mark.timeout(current_profile().timeout),
              pytest.mark.flaky(reruns=1, reruns_delay=5)]


@pytest.fixture
def celery_integration(rabbit_vhost: RabbitVhost, chaos_env: ChaosEnv
                       ) -> Iterator[CeleryIntegration]:
    integration = CeleryIntegration(rabbit_vhost, chaos_env.run_id)
    try:
        yield integration
    finally:
        integration.close()


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


@pytest.mark.rabbitmq
def test_dramatiq_ledger_under_chaos(dramatiq_integration: DramatiqIntegration,
                                     chaos_env: ChaosEnv) -> None:
    run_chaos(dramatiq_integration, chaos_env)


@pytest.mark.kafka
def test_kafka_ledger_under_chaos(kafka_integration: KafkaIntegration,
                                  chaos_env: ChaosEnv) -> None:
    run_chaos(kafka_integration, chaos_env)
