"""Kafka consumer loop on confluent-kafka: commit only what is durably done.

Spec sheet
----------
* **Commits**: ``enable.auto.commit`` is forced off (a config that turns it on is refused
  with ``CONFIGURATION_ERROR``).  After each poll the loop commits, synchronously, for each
  partition the offset after the last message whose outcome is durable — ``executed``,
  ``replayed``, or ``poisoned`` / ``rejected`` *after* its dead letter was flushed.  It never
  commits past a message that is waiting for a retry.
* **Retries** (``failed``, ``in_progress``, ``store_unavailable``, and an outcome that could
  not be recorded): the message's partition is paused and sought back to it; after
  ``retry_backoff`` (exponential, jittered, per partition) it is resumed and the message is
  consumed again.  Other partitions keep flowing.  The rest of that partition's poll is not
  processed now (ordering): with ``batch_size=1`` no later message of a partition runs before
  an earlier one is settled.  With ``batch_size > 1`` the batch's bodies all ran before the
  loop learns of the retry: the later messages of that partition are consumed again after it
  and replayed (their effects are not repeated).
* **Dead letters**: poisoned/rejected messages are produced to ``dead_letter_topic`` with
  the original key, value and headers plus ``idempotency-error-code`` (a permanent body error
  gives ``REQUEST_FAILED`` with the exception class in ``idempotency-error``),
  ``idempotency-original-topic``, ``-partition`` and ``-offset``, flushed, and only then
  committed; a dead letter that cannot be delivered is a retry.  Without a
  ``dead_letter_topic`` they are logged (``dead_letter_dropped``) and committed: the record in
  the store keeps the verdict, and they never loop.
* **Rebalances** (eager and cooperative-sticky alike): on revoke, the offsets of durable
  outcomes not yet committed are committed — never past a message waiting for a retry — and
  pending retries of the revoked partitions are dropped and their partitions resumed (the
  new owner, this consumer again included, starts from the committed offset and runs or
  replays what follows: librdkafka keeps a partition paused through an eager rebalance that
  gives it back); on a lost assignment nothing is committed.  A consumer stopped mid-body
  finishes the message in hand, commits it, and leaves the group.
* **Defaults**: ``auto.offset.reset`` is ``earliest`` unless the config says otherwise (a new
  group must not skip messages produced before it joined).
* **Crashes**: a killed loop leaves its uncommitted messages to the group; claimed scopes stay
  PROCESSING until their leases expire, then a redelivery takes them over (one attempt
  counted), see docs/guarantees.md.  Background recovery/cleanup runs in the loop's process
  (:class:`~idempotent_tasks._maintenance.MaintenanceRunner`, one worker per job fleet-wide).
* **Stop**: ``run(fn, stop=event)`` returns after the message in hand; without ``stop`` the
  loop installs SIGTERM/SIGINT handlers and runs until one arrives.  A body must finish within
  ``max.poll.interval.ms`` (default 300 s) or the group evicts the consumer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core import tracing
from .._core.errors import ConfigurationError
from .._core.outcome import Outcome
from ._consumer import IdempotentConsumer
from ._loop import (
    DEFAULT_RETRY_BACKOFF,
    Backoff,
    MaintenanceOption,
    OutcomeCallback,
    maintenance,
    resolve_stop,
)
from ._message import (
    DEAD_LETTER_HEADERS,
    Message,
    dead_letter_headers,
    header_text,
    normalize_header_name,
)
from ._semconv import loop_attributes

try:
    import confluent_kafka
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "KafkaConsumerLoop needs confluent-kafka: pip install 'idempotent-tasks[kafka]'"
    ) from exc

TP = tuple[str, int]

#: Consumer-only settings that a dead-letter producer derived from the consumer's config drops.
_CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "group.protocol", "group.remote.assignor",
    "enable.auto.commit", "enable.auto.offset.store", "auto.commit.interval.ms",
    "auto.offset.reset", "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
    "partition.assignment.strategy", "isolation.level", "enable.partition.eof",
    "fetch.min.bytes", "fetch.max.bytes", "fetch.wait.max.ms", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "queued.min.messages", "queued.max.messages.kbytes",
    "check.crcs", "on_commit", "consume.callback.max.messages",
})
_TRUE = ("true", "1", "yes")


def consumer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer's config with the loop's guarantees applied (see the module docstring)."""
    conf = dict(config)
    for required in ("bootstrap.servers", "group.id"):
        if not conf.get(required):
            raise ConfigurationError(f"KafkaConsumerLoop needs {required!r} in its config")
    if str(conf.get("enable.auto.commit", False)).lower() in _TRUE:
        raise ConfigurationError(
            "enable.auto.commit must be false: the loop commits an offset only after the "
            "message's outcome is durable"
        )
    conf["enable.auto.commit"] = False
    conf["enable.auto.offset.store"] = False
    conf.setdefault("auto.offset.reset", "earliest")
    return conf


def producer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A dead-letter producer's config derived from the consumer's: connection settings
    kept, consumer-only ones dropped, idempotent delivery with ``acks=all``."""
    conf = {k: v for k, v in config.items() if k not in _CONSUMER_ONLY}
    conf.setdefault("enable.idempotence", True)
    conf.setdefault("acks", "all")
    return conf


def to_message(native: Any) -> Message:
    """confluent-kafka's message → :class:`Message` (header bytes decoded as UTF-8; with a
    repeated header name the first occurrence wins)."""
    headers: dict[str, Any] = {}
    for name, value in native.headers() or ():
        headers.setdefault(name, header_text(value))
    content_type = next(
        (v for k, v in headers.items() if normalize_header_name(k) == "content-type"), None
    )
    return Message(
        native.value(), headers, key=native.key(), topic=native.topic(),
        partition=native.partition(), offset=native.offset(),
        content_type=content_type if isinstance(content_type, str) else None,
    )


@dataclass(slots=True)
class _Retry:
    offset: int
    due: float


@dataclass(slots=True)
class _Plan:
    """What one poll decided for one partition."""

    settled: list[tuple[Any, Message, Outcome]] = field(default_factory=list)
    retry: tuple[Any, Outcome] | None = None


class KafkaConsumerLoop:
    """Consume ``topics`` through an :class:`IdempotentConsumer` (see the module docstring)."""

    def __init__(
        self,
        consumer: IdempotentConsumer,
        config: Mapping[str, Any],
        *,
        topics: Sequence[str],
        dead_letter_topic: str | None = None,
        retry_backoff: tuple[float, float] = DEFAULT_RETRY_BACKOFF,
        batch_size: int = 1,
        poll_timeout: float = 0.5,
        producer: Mapping[str, Any] | None = None,
        maintenance: MaintenanceOption = True,
        on_outcome: OutcomeCallback | None = None,
        dead_letter_timeout: float = 30.0,
    ) -> None:
        if not topics:
            raise ConfigurationError("KafkaConsumerLoop needs at least one topic")
        if batch_size < 1:
            raise ConfigurationError("batch_size must be at least 1")
        self.consumer = consumer
        self.config = consumer_config(config)
        self.topics = list(topics)
        self.dead_letter_topic = dead_letter_topic
        self.backoff = Backoff(retry_backoff)
        self.batch_size = batch_size
        self.poll_timeout = poll_timeout
        self.producer_config = dict(producer) if producer is not None else producer_config(config)
        self.maintenance = maintenance
        self.on_outcome = on_outcome
        self.dead_letter_timeout = dead_letter_timeout
        self.log = consumer.handler.logger
        self._kafka: Any = None
        self._producer: Any = None
        self._retries: dict[TP, _Retry] = {}
        self._attempts: dict[TP, int] = {}
        self._uncommitted: dict[TP, int] = {}

    # ------------------------------------------------------------------ running
    def run(self, fn: Callable[..., Any], stop: threading.Event | None = None) -> None:
        """Consume until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is not given)."""
        stop = resolve_stop(stop)
        self._kafka = confluent_kafka.Consumer(self.config)
        self._kafka.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self.log.info("consumer_started", broker="kafka", topics=self.topics,
                      operation=self.consumer.operation)
        try:
            with maintenance(self.consumer.handler, self.maintenance):
                while not stop.is_set():
                    self.poll_once(fn)
        finally:
            self._shutdown()

    def poll_once(self, fn: Callable[..., Any]) -> int:
        """One poll: resume due retries, process what arrived, settle it. Returns the number
        of messages processed."""
        self._resume_due()
        natives = self._kafka.consume(num_messages=self.batch_size, timeout=self.poll_timeout)
        natives = [m for m in natives if self._usable(m)]
        if not natives:
            return 0
        messages = [to_message(m) for m in natives]
        with tracing.messaging(loop_attributes("kafka", self.config.get("group.id"))):
            if self.batch_size == 1:
                outcomes = [self.consumer.process(messages[0], fn)]
            else:
                outcomes = self.consumer.process_batch(messages, fn)
        if self.on_outcome is not None:
            for message, outcome in zip(messages, outcomes, strict=True):
                self.on_outcome(message, outcome)
        self._settle(natives, messages, outcomes)
        return len(messages)

    def _usable(self, native: Any) -> bool:
        error = native.error()
        if error is None:
            return True
        if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
            return False
        if error.fatal():
            raise confluent_kafka.KafkaException(error)
        self.log.warning("kafka_consume_error", error=str(error))
        return False

    # ------------------------------------------------------------------ settling
    def _settle(
        self, natives: Sequence[Any], messages: Sequence[Message], outcomes: Sequence[Outcome]
    ) -> None:
        plans: dict[TP, _Plan] = {}
        for native, message, outcome in zip(natives, messages, outcomes, strict=True):
            plan = plans.setdefault((native.topic(), native.partition()), _Plan())
            if plan.retry is not None:
                continue  # behind a retry in its partition: consumed again after it
            if outcome.settled:
                plan.settled.append((native, message, outcome))
            else:
                plan.retry = (native, outcome)
        failed = self._dead_letter(plans)
        for tp, plan in plans.items():
            self._apply(tp, plan, failed)
        self._commit()

    def _apply(self, tp: TP, plan: _Plan, failed: dict[TP, int]) -> None:
        """Advance the commit position over the settled prefix; schedule the retry."""
        stop_at = failed.get(tp)
        for native, _message, _outcome in plan.settled:
            if stop_at is not None and native.offset() >= stop_at:
                self._retry_later(native, "dead_letter_failed")
                return
            self._uncommitted[tp] = native.offset() + 1
            self._attempts.pop(tp, None)
        if plan.retry is not None:
            native, outcome = plan.retry
            self._retry_later(native, outcome.kind, outcome)

    def _retry_later(self, native: Any, reason: str, outcome: Outcome | None = None) -> None:
        tp = (native.topic(), native.partition())
        attempt = self._attempts.get(tp, 0)
        self._attempts[tp] = attempt + 1
        delay = self.backoff.delay(attempt)
        position = confluent_kafka.TopicPartition(tp[0], tp[1], native.offset())
        self._kafka.pause([position])
        self._kafka.seek(position)
        self._retries[tp] = _Retry(native.offset(), time.monotonic() + delay)
        self.log.info(
            "message_retry_scheduled", topic=tp[0], partition=tp[1], offset=native.offset(),
            reason=reason, delay=round(delay, 3), attempt=attempt + 1,
            error_code=None if outcome is None or outcome.error_code is None
            else outcome.error_code.value,
            tenant=None if outcome is None else outcome.tenant,
            key=None if outcome is None else outcome.key,
        )

    def _resume_due(self) -> None:
        now = time.monotonic()
        due = [tp for tp, retry in self._retries.items() if retry.due <= now]
        for tp in due:
            del self._retries[tp]
        if due:
            self._kafka.resume([confluent_kafka.TopicPartition(t, p) for t, p in due])

    # ------------------------------------------------------------------ dead letters
    def _dead_letter(self, plans: Mapping[TP, _Plan]) -> dict[TP, int]:
        """Produce and flush the dead letters of this poll; returns, per partition, the
        lowest offset whose dead letter was not delivered."""
        pending = [
            (native, message, outcome)
            for plan in plans.values()
            for native, message, outcome in plan.settled
            if outcome.dead_letter
        ]
        if not pending:
            return {}
        if self.dead_letter_topic is None:
            for native, _message, outcome in pending:
                self._log_dead_letter("dead_letter_dropped", native, outcome)
            return {}
        return self._produce_dead_letters(pending)

    def _produce_dead_letters(
        self, pending: Sequence[tuple[Any, Message, Outcome]]
    ) -> dict[TP, int]:
        producer = self._dead_letter_producer()
        errors: list[Any] = []
        failed: dict[TP, int] = {}
        for native, message, outcome in pending:
            reports: list[Any] = []
            producer.produce(
                self.dead_letter_topic, value=native.value(), key=native.key(),
                headers=_dead_letter_header_list(native, message, outcome),
                on_delivery=lambda err, _msg, box=reports: box.append(err),
            )
            errors.append((native, outcome, reports))
        producer.flush(self.dead_letter_timeout)
        for native, outcome, reports in errors:
            tp = (native.topic(), native.partition())
            if reports and reports[0] is None:
                self._log_dead_letter("message_dead_lettered", native, outcome)
                continue
            self.log.error("dead_letter_failed", topic=tp[0], partition=tp[1],
                           offset=native.offset(), error=str(reports[0]) if reports else "timeout")
            failed[tp] = min(failed.get(tp, native.offset()), native.offset())
        return failed

    def _dead_letter_producer(self) -> Any:
        if self._producer is None:
            self._producer = confluent_kafka.Producer(self.producer_config)
        return self._producer

    def _log_dead_letter(self, event: str, native: Any, outcome: Outcome) -> None:
        self.log.warning(
            event, topic=native.topic(), partition=native.partition(), offset=native.offset(),
            dead_letter_topic=self.dead_letter_topic, kind=outcome.kind,
            error_code=None if outcome.error_code is None else outcome.error_code.value,
            error=outcome.error, tenant=outcome.tenant, key=outcome.key,
        )

    # ------------------------------------------------------------------ commits & rebalances
    def _commit(self, only: Sequence[TP] | None = None) -> None:
        todo = {tp: off for tp, off in self._uncommitted.items() if only is None or tp in only}
        if not todo:
            return
        offsets = [confluent_kafka.TopicPartition(t, p, off) for (t, p), off in todo.items()]
        try:
            self._kafka.commit(offsets=offsets, asynchronous=False)
        except confluent_kafka.KafkaException as exc:
            # Not committed: the messages may come back and are then replayed, never re-run.
            self.log.warning("commit_failed", error=str(exc), partitions=len(offsets))
            return
        for tp, off in todo.items():
            if self._uncommitted.get(tp) == off:
                del self._uncommitted[tp]

    def _forget(self, partitions: Sequence[Any]) -> None:
        paused = []
        for native_tp in partitions:
            tp = (native_tp.topic, native_tp.partition)
            if self._retries.pop(tp, None) is not None:
                paused.append(confluent_kafka.TopicPartition(*tp))
            self._attempts.pop(tp, None)
            self._uncommitted.pop(tp, None)
        if paused:  # else, assigned back by an eager rebalance, it stays paused for good
            self._kafka.resume(paused)

    def _on_assign(self, kafka: Any, partitions: Sequence[Any]) -> None:
        self._forget(partitions)
        self.log.info("partitions_assigned", partitions=_names(partitions))

    def _on_revoke(self, kafka: Any, partitions: Sequence[Any]) -> None:
        self._commit([(p.topic, p.partition) for p in partitions])
        self._forget(partitions)
        self.log.info("partitions_revoked", partitions=_names(partitions))

    def _on_lost(self, kafka: Any, partitions: Sequence[Any]) -> None:
        self._forget(partitions)
        self.log.warning("partitions_lost", partitions=_names(partitions))

    def _shutdown(self) -> None:
        try:
            self._commit()
        finally:
            self._kafka.close()
            if self._producer is not None:
                self._producer.flush(self.dead_letter_timeout)
            self.log.info("consumer_stopped", broker="kafka", operation=self.consumer.operation)


def _names(partitions: Sequence[Any]) -> list[str]:
    return [f"{p.topic}[{p.partition}]" for p in partitions]


def _dead_letter_header_list(
    native: Any, message: Message, outcome: Outcome
) -> list[tuple[str, bytes | None]]:
    """Original headers (minus stale ``idempotency-*`` dead-letter ones), then ours."""
    ours = dead_letter_headers(message, outcome)
    kept = [
        (k, v) for k, v in native.headers() or ()
        if normalize_header_name(k) not in DEAD_LETTER_HEADERS
    ]
    return kept + [(k, v.encode("utf-8")) for k, v in ours.items()]


__all__ = ["KafkaConsumerLoop", "consumer_config", "producer_config", "to_message"]
