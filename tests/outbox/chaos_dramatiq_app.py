"""The Dramatiq side of the outbox chaos run (``dramatiq tests.outbox.chaos_dramatiq_app``):
the ``ship`` actor, transactional, writes ``hop2-dramatiq``.  The relay imports ``broker`` to
publish Dramatiq follow-ups (with publisher confirms)."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from idempotent_tasks.dramatiq import IdempotencyMiddleware, current_connection, idempotent_actor

from ._chaos_config import SHIP, ChaosConfig, make_handler, write

cfg = ChaosConfig.from_env()
broker = RabbitmqBroker(url=cfg.broker_url, confirm_delivery=True)
broker.add_middleware(IdempotencyMiddleware(make_handler(cfg), recover_every=2.0,
                                            cleanup_every=600.0))
dramatiq.set_broker(broker)


@idempotent_actor(actor_name="ship", operation=SHIP, queue_name=cfg.ship_queue,
                  transactional=True, min_backoff=200, max_backoff=1000)
def ship(order: str) -> str:
    return write(cfg, current_connection(), "hop2-dramatiq", order)
