"""The Dramatiq app chaos worker subprocesses run (``dramatiq tests.chaos.dramatiq_app``).

RabbitMQ broker, the idempotency middleware (in-worker recovery every 2 s) and Dramatiq's
``Results`` on the shared Redis under a per-run namespace, so every delivery's result — fresh
or replayed — can be read back by the harness.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from idempotent_tasks.dramatiq import IdempotencyMiddleware, current_connection, idempotent_actor

from ._body import OPERATIONS, LedgerWriter, WorkerConfig, make_handler


class DeliveryLog(Middleware):
    """Logs every delivery this worker receives, so that a drain that stalls can tell a
    message that never arrived from one that was processed."""

    log = logging.getLogger("chaos")

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.log.info("chaos_delivery message_id=%s redelivered=%s", message.message_id,
                      getattr(message, "redelivered", None))


cfg = WorkerConfig.from_env()
handler = make_handler(cfg)
broker = RabbitmqBroker(url=cfg.broker_url)
broker.add_middleware(IdempotencyMiddleware(handler, recover_every=2.0, cleanup_every=600.0))
broker.add_middleware(
    Results(  # type: ignore[no-untyped-call]
        backend=RedisBackend(url=cfg.result_url, namespace=cfg.result_namespace)
    )
)
broker.add_middleware(DeliveryLog())
dramatiq.set_broker(broker)
ledger = LedgerWriter(cfg)
FAST: dict[str, Any] = {
    "queue_name": cfg.queue, "min_backoff": 200, "max_backoff": 1000, "store_results": True,
}


@idempotent_actor(
    actor_name="chaos_tx", operation=OPERATIONS["transactional"], transactional=True, **FAST
)
def chaos_tx(key: str) -> dict[str, str]:
    return ledger.transactional(current_connection(), key)


@idempotent_actor(actor_name="chaos_plain", operation=OPERATIONS["plain"], **FAST)
def chaos_plain(key: str) -> dict[str, str]:
    return ledger.plain(key)
