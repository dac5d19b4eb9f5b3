"""Running a relay in Dramatiq workers: ``broker.add_middleware(OutboxRelayMiddleware(relay))``.

Every worker process starts the relay after it booted and stops it before it shuts down; one
of them holds each kind's lease and publishes, the others stand by (Dramatiq has no periodic
scheduler, so this is the way to run it there — or ``idempotent-tasks relay`` beside them).
"""

from __future__ import annotations

from typing import Any

import dramatiq

from .relay import OutboxRelay


class OutboxRelayMiddleware(dramatiq.Middleware):
    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self.relay.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.relay.stop()


__all__ = ["OutboxRelayMiddleware"]
