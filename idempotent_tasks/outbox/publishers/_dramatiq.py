"""Staged Dramatiq messages, enqueued on the broker (its middleware runs as for any send).

The message id is the staged key and the options carry ``idempotency_key`` and ``tenant``,
so an ``@idempotent_actor`` receiving a republished message replays instead of running
again.  Durability is the broker's: ``RabbitmqBroker(confirm_delivery=True)`` makes
``enqueue`` return only once RabbitMQ has the message.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._core.keys import KEY_OPTION
from ._base import SENT, PublishResult, rejected, unavailable

if TYPE_CHECKING:
    from .._table import OutboxRow


class DramatiqPublisher:
    """Publishes ``dramatiq`` rows on ``broker`` (default: ``dramatiq.get_broker()``)."""

    kind = "dramatiq"

    def __init__(self, broker: Any = None) -> None:
        import dramatiq

        self.broker = broker if broker is not None else dramatiq.get_broker()
        self._message = dramatiq.Message
        broker_down = (  # renamed in Dramatiq 2; the old name warns
            getattr(dramatiq.errors, "BrokerConnectionError", None)
            or dramatiq.errors.ConnectionError
        )
        self._down: tuple[type[BaseException], ...] = (broker_down, ConnectionError, OSError)

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        results: list[PublishResult] = []
        for row in rows:
            result = self._send(row)
            results.append(result)
            if result.state == "unavailable":
                results += [result] * (len(rows) - len(results))
                break
        return results

    def _send(self, row: OutboxRow) -> PublishResult:
        fields = row.fields
        options = {**(fields.get("options") or {}), KEY_OPTION: row.key, "tenant": row.tenant}
        message: Any = self._message(
            queue_name=fields["queue_name"], actor_name=fields["actor_name"],
            args=tuple(fields.get("args") or ()), kwargs=dict(fields.get("kwargs") or {}),
            options=options, message_id=row.key, message_timestamp=int(time.time() * 1000),
        )
        try:
            self.broker.enqueue(message, delay=fields.get("delay"))
        except self._down as exc:
            return unavailable(exc)
        except Exception as exc:  # unroutable, refused by a middleware, …
            return rejected(exc)
        return SENT

    def close(self) -> None:
        return None


__all__ = ["DramatiqPublisher"]
