"""Staged Kafka records, produced in one batch and flushed (confluent-kafka).

The producer is idempotent with ``acks=all`` by default, so records of one partition keep
their order through librdkafka's retries; the batch is flushed before the relay marks
anything sent, and only records whose delivery report carries no error are ``sent``.  Every
record carries the headers ``idempotency-key`` and ``idempotency-tenant`` (what
``IdempotentConsumer`` reads); its key is the staged one's, or the parent scope's hash.

A delivery error on *every* record of a batch is an outage when the broker does not answer a
metadata request either (``unavailable``: not counted, the relay backs off); when it does,
the records themselves are refused (``rejected``: counted, then poisoned) — an unknown topic
with auto-creation off, a record over ``message.max.bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..._core.keys import KEY_HEADER, TENANT_HEADER
from .._targets import bytes_of_text
from ._base import DEFERRED, SENT, PublishResult, rejected, unavailable

if TYPE_CHECKING:
    from .._table import OutboxRow

#: The relay's producer settings unless the configuration given says otherwise.
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "message.timeout.ms": 15000,
}
_PROBE_TIMEOUT = 5.0


class KafkaPublisher:
    """Publishes ``kafka`` rows with a confluent-kafka ``Producer`` (built from ``config``
    merged over :data:`PRODUCER_DEFAULTS`, or the one given)."""

    kind = "kafka"

    def __init__(self, config: Mapping[str, Any] | Any, *, flush_timeout: float | None = None
                 ) -> None:
        from confluent_kafka import Producer

        if isinstance(config, Mapping):
            settings = {**PRODUCER_DEFAULTS, **config}
            self.producer: Any = Producer(settings)
            self._owned = True
            timeout_ms = float(settings["message.timeout.ms"])
        else:
            self.producer, self._owned, timeout_ms = config, False, 30000.0
        self.flush_timeout = flush_timeout if flush_timeout is not None else timeout_ms / 1000 + 5

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        results: list[PublishResult | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            failure = self._produce(row, i, results)
            if failure is not None:
                results[i] = failure
                if failure.state == "unavailable":
                    break
        self.producer.flush(self.flush_timeout)
        done = [r if r is not None else DEFERRED for r in results]
        if done and all(r.state == "unavailable" for r in done) and self._answers():
            return [rejected(f"{r.error} (the broker answers: the record is refused)")
                    for r in done]
        return done

    def _produce(self, row: OutboxRow, i: int, results: list[PublishResult | None]
                 ) -> PublishResult | None:
        from confluent_kafka import KafkaException

        fields = row.fields
        headers = [(k, bytes_of_text(v) or b"") for k, v in (fields.get("headers") or {}).items()]
        headers += [(KEY_HEADER, row.key.encode()), (TENANT_HEADER, row.tenant.encode())]
        extra = {} if fields.get("partition") is None else {"partition": fields["partition"]}

        def delivered(err: Any, _msg: Any) -> None:
            results[i] = SENT if err is None else _classified(err)

        try:
            self.producer.produce(
                fields["topic"], value=row.body, key=bytes_of_text(fields.get("key")),
                headers=headers, on_delivery=delivered, **extra,
            )
        except BufferError as exc:  # the local queue is full: flush what is in it
            self.producer.flush(self.flush_timeout)
            return unavailable(exc)
        except KafkaException as exc:  # refused before sending (e.g. too large)
            return rejected(exc)
        self.producer.poll(0)
        return None

    def _answers(self) -> bool:
        try:
            self.producer.list_topics(timeout=_PROBE_TIMEOUT)
        except Exception:
            return False
        return True

    def close(self) -> None:
        if self._owned:
            self.producer.flush(self.flush_timeout)


def _classified(err: Any) -> PublishResult:
    """A delivery error: retriable ones (timeouts, transport) mean the broker is away."""
    try:
        retriable = bool(err.retriable()) or err.code() < 0  # librdkafka's local errors
    except Exception:
        retriable = True
    return unavailable(str(err)) if retriable else rejected(str(err))


__all__ = ["PRODUCER_DEFAULTS", "KafkaPublisher"]
