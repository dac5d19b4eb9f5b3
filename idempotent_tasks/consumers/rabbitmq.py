"""RabbitMQ consumer loop on kombu: ack only what is durably done.

Why kombu: it is already a dependency of Celery (one AMQP client for the whole project), it
is maintained, its ``Connection`` knows the broker's connection/channel error classes, and
its ``pyamqp`` transport does publisher confirms (``confirm_publish``), which the dead-letter
path needs: a dead letter must be in the broker before the original is acked.  pika would
serve too, but would add a second client with its own reconnect story.

Spec sheet
----------
* **Topology**, declared idempotently on every (re)connect: the queue (durable, with
  ``x-dead-letter-exchange``), the dead-letter exchange (``<queue>.dlx`` unless given; fanout,
  durable) and the queue ``<queue>.dead`` bound to it, so dead letters are kept for inspection
  out of the box.  A queue or exchange that already exists with other arguments is reported
  as an :class:`~idempotent_tasks.IdempotencyError` with ``CONFIGURATION_ERROR`` naming it and
  the arguments the loop wanted — never a raw channel error.
* **Acks**: a message is acked only after its outcome is durable — ``executed`` and
  ``replayed`` at once; ``poisoned`` / ``rejected`` after its dead letter was published to the
  dead-letter exchange *and confirmed* (original body and properties, original headers plus
  ``idempotency-error-code``, ``idempotency-error`` for a body's exception,
  ``idempotency-original-topic`` (the queue) and ``idempotency-original-offset`` (the delivery
  tag); queues have no partitions, so ``idempotency-original-partition`` is absent).
* **Retries** (``failed``, ``in_progress``, ``store_unavailable``, an unrecorded outcome, a
  dead letter that was not confirmed): the loop *holds* the unacked message for the backoff
  (exponential from ``retry_backoff``, jittered, per scope) and then requeues it
  (``basic.reject(requeue=True)``); the broker redelivers it.  Chosen over a TTL retry queue
  (a publish-then-ack pair that could lose or duplicate on a crash between them, and FIFO
  expiry that lets a long delay hold back short ones) and over sleep-then-nack (which blocks
  every other message): a held message costs one prefetch slot, nothing else waits for it,
  and if the process dies the broker redelivers it because it was never acked.  When all
  ``prefetch`` slots are held (e.g. the store is down) consumption pauses by itself —
  backpressure, not a busy loop.
* **Reconnects**: on a connection or channel error the loop drops what it holds (the broker
  requeues unacked messages of a dead channel), waits with backoff, reconnects, redeclares and
  resumes.  Configuration errors are not retried.
* **Crashes**: an unacked message comes back; a claimed scope stays PROCESSING until its lease
  expires and a redelivery takes it over (one attempt counted), see docs/guarantees.md.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .._core import tracing
from .._core.errors import ConfigurationError, IdempotencyError
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
    import kombu as _kombu
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "RabbitMQConsumerLoop needs kombu: pip install 'idempotent-tasks[rabbitmq]'"
    ) from exc

#: kombu's annotations are partial; treat it as untyped rather than sprinkle ignores.
kombu: Any = _kombu

DEFAULT_PREFETCH = 32
_MAX_TRACKED_ATTEMPTS = 10_000
_PRECONDITION_FAILED = 406


def to_message(native: Any, queue: str) -> Message:
    """kombu's message → :class:`Message` (``topic`` = queue, ``offset`` = delivery tag)."""
    headers = {str(k): header_text(v) for k, v in (native.headers or {}).items()}
    properties = native.properties or {}
    return Message(
        native.body, headers, key=(native.delivery_info or {}).get("routing_key"), topic=queue,
        offset=native.delivery_tag, message_id=properties.get("message_id"),
        content_type=native.content_type,
    )


class RabbitMQConsumerLoop:
    """Consume ``queue`` through an :class:`IdempotentConsumer` (see the module docstring)."""

    def __init__(
        self,
        consumer: IdempotentConsumer,
        url: str,
        *,
        queue: str,
        dead_letter_exchange: str | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        retry_backoff: tuple[float, float] = DEFAULT_RETRY_BACKOFF,
        batch_size: int = 1,
        queue_arguments: Mapping[str, Any] | None = None,
        maintenance: MaintenanceOption = True,
        on_outcome: OutcomeCallback | None = None,
        poll_timeout: float = 0.2,
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not queue:
            raise ConfigurationError("RabbitMQConsumerLoop needs a queue name")
        if batch_size < 1 or prefetch < batch_size:
            raise ConfigurationError("need 1 <= batch_size <= prefetch")
        self.consumer = consumer
        self.url = url
        self.queue_name = queue
        self.dead_letter_exchange = dead_letter_exchange or f"{queue}.dlx"
        self.dead_queue_name = f"{queue}.dead"
        self.prefetch = prefetch
        self.backoff = Backoff(retry_backoff)
        self.batch_size = batch_size
        self.queue_arguments = {
            **dict(queue_arguments or {}),
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }
        self.maintenance = maintenance
        self.on_outcome = on_outcome
        self.poll_timeout = poll_timeout
        self.connection_options = dict(connection_options or {})
        self.log = consumer.handler.logger
        self._conn: Any = None
        self._producer: Any = None
        self._inbox: list[Any] = []
        self._held: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self._attempts: OrderedDict[str, int] = OrderedDict()
        self._broker_errors: tuple[type[BaseException], ...] | None = None

    # ------------------------------------------------------------------ topology
    def _exchange(self) -> Any:
        return kombu.Exchange(self.dead_letter_exchange, type="fanout", durable=True)

    def _queue(self) -> Any:
        return kombu.Queue(
            self.queue_name, exchange=kombu.Exchange(""), routing_key=self.queue_name,
            durable=True, queue_arguments=self.queue_arguments,
        )

    def declare(self, channel: Any | None = None) -> None:
        """Declare the queue, the dead-letter exchange and ``<queue>.dead`` (idempotent).

        Raises ``CONFIGURATION_ERROR`` when one exists with other arguments."""
        own = channel is None
        conn = None
        if own:
            conn = self._connection()
            channel = conn.channel()
        try:
            dlx = self._exchange()
            self._declare_one(lambda: dlx(channel).declare(), "exchange",
                              self.dead_letter_exchange, {"type": "fanout", "durable": True})
            dead = kombu.Queue(self.dead_queue_name, exchange=dlx, routing_key="#", durable=True)
            self._declare_one(lambda: dead(channel).declare(), "queue",
                              self.dead_queue_name, {"durable": True})
            self._declare_one(lambda: self._queue()(channel).declare(), "queue",
                              self.queue_name, {"durable": True, **self.queue_arguments})
        finally:
            if conn is not None:
                conn.release()

    def _declare_one(
        self, declare: Callable[[], Any], kind: str, name: str, wanted: Mapping[str, Any]
    ) -> None:
        try:
            declare()
        except Exception as exc:
            if getattr(exc, "code", None) != _PRECONDITION_FAILED:
                raise
            raise ConfigurationError(
                f"RabbitMQ {kind} {name!r} already exists with other arguments; "
                f"RabbitMQConsumerLoop declares it with {dict(wanted)!r}. Delete it, or "
                f"configure the loop to match it (broker said: {exc})"
            ) from exc

    # ------------------------------------------------------------------ running
    def run(self, fn: Callable[..., Any], stop: threading.Event | None = None) -> None:
        """Consume until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is not given)."""
        stop = resolve_stop(stop)
        failures = 0
        with maintenance(self.consumer.handler, self.maintenance):
            while not stop.is_set():
                try:
                    self._consume(fn, stop)
                    return
                except IdempotencyError:
                    raise
                except Exception as exc:
                    if not self._is_broker_error(exc):
                        raise
                    delay = self.backoff.delay(failures)
                    failures += 1
                    self.log.error("broker_connection_lost", broker="rabbitmq",
                                   queue=self.queue_name, error=repr(exc), retry_in=delay)
                    self._drop_connection()
                    stop.wait(delay)

    def _is_broker_error(self, exc: Exception) -> bool:
        """A connection or channel error of the transport: reconnect, do not crash."""
        if self._broker_errors is None:
            probe = kombu.Connection(self.url)  # builds the transport; does not connect
            self._broker_errors = (*probe.connection_errors, *probe.channel_errors)
        return isinstance(exc, self._broker_errors)

    def _connection(self) -> Any:
        options = {"transport_options": {"confirm_publish": True}, **self.connection_options}
        return kombu.Connection(self.url, **options)

    def _consume(self, fn: Callable[..., Any], stop: threading.Event) -> None:
        self._conn = self._connection()
        channel = self._conn.channel()
        self.declare(channel)
        self._producer = kombu.Producer(channel)
        listener = kombu.Consumer(
            channel, queues=[self._queue()], on_message=self._on_message,
            prefetch_count=self.prefetch, no_ack=False, auto_declare=False,
        )
        listener.consume()
        self.log.info("consumer_started", broker="rabbitmq", queue=self.queue_name,
                      operation=self.consumer.operation)
        try:
            while not stop.is_set():
                self.poll_once(fn)
        finally:
            self._requeue_held()
            self._drop_connection()
            self.log.info("consumer_stopped", broker="rabbitmq", queue=self.queue_name)

    def _on_message(self, native: Any) -> None:
        self._inbox.append(native)

    def poll_once(self, fn: Callable[..., Any]) -> int:
        """Requeue due held messages, receive up to ``batch_size``, process and settle them."""
        self._requeue_due()
        self._receive()
        if not self._inbox:
            return 0
        natives, self._inbox = self._inbox, []
        messages = [to_message(n, self.queue_name) for n in natives]
        with tracing.messaging(loop_attributes("rabbitmq")):
            if len(messages) == 1:
                outcomes = [self.consumer.process(messages[0], fn)]
            else:
                outcomes = self.consumer.process_batch(messages, fn)
        if self.on_outcome is not None:
            for message, outcome in zip(messages, outcomes, strict=True):
                self.on_outcome(message, outcome)
        for native, message, outcome in zip(natives, messages, outcomes, strict=True):
            self._settle(native, message, outcome)
        return len(messages)

    def _receive(self) -> None:
        timeout = self.poll_timeout
        if self._held:
            timeout = max(0.0, min(timeout, self._held[0][0] - time.monotonic()))
        while len(self._inbox) < self.batch_size:
            try:
                self._conn.drain_events(timeout=timeout if not self._inbox else 0.005)
            except TimeoutError:
                return

    # ------------------------------------------------------------------ settling
    def _settle(self, native: Any, message: Message, outcome: Outcome) -> None:
        if outcome.retry:
            self._hold(native, message, outcome)
            return
        if outcome.dead_letter and not self._publish_dead_letter(native, message, outcome):
            self._hold(native, message, outcome)
            return
        self._attempts.pop(_attempt_key(message, outcome), None)
        native.ack()

    def _publish_dead_letter(self, native: Any, message: Message, outcome: Outcome) -> bool:
        ours = dead_letter_headers(message, outcome)
        headers = {
            k: v for k, v in (native.headers or {}).items()
            if normalize_header_name(str(k)) not in DEAD_LETTER_HEADERS
        }
        headers.update(ours)
        properties = native.properties or {}
        extra = {k: properties[k] for k in ("message_id", "correlation_id") if properties.get(k)}
        try:
            self._producer.publish(
                native.body, exchange=self.dead_letter_exchange, routing_key=self.queue_name,
                headers=headers, content_type=native.content_type or "application/octet-stream",
                content_encoding=native.content_encoding or "binary", delivery_mode=2,
                serializer=None, **extra,
            )
        except Exception as exc:
            if self._is_broker_error(exc):
                raise  # the channel is gone: reconnect; the unacked message comes back
            self.log.error("dead_letter_failed", queue=self.queue_name, error=repr(exc),
                           tenant=outcome.tenant, key=outcome.key)
            return False
        self.log.warning(
            "message_dead_lettered", queue=self.queue_name, exchange=self.dead_letter_exchange,
            kind=outcome.kind, error_code=ours["idempotency-error-code"], error=outcome.error,
            tenant=outcome.tenant, key=outcome.key,
        )
        return True

    def _hold(self, native: Any, message: Message, outcome: Outcome) -> None:
        """Keep the message unacked for the backoff, then requeue it (module docstring)."""
        key = _attempt_key(message, outcome)
        attempt = self._attempts.pop(key, 0)
        self._attempts[key] = attempt + 1
        while len(self._attempts) > _MAX_TRACKED_ATTEMPTS:
            self._attempts.popitem(last=False)
        delay = self.backoff.delay(attempt)
        heapq.heappush(self._held, (time.monotonic() + delay, next(self._seq), native))
        self.log.info(
            "message_retry_scheduled", queue=self.queue_name, reason=outcome.kind,
            delay=round(delay, 3), attempt=attempt + 1, tenant=outcome.tenant, key=outcome.key,
            error_code=None if outcome.error_code is None else outcome.error_code.value,
        )

    def _requeue_due(self) -> None:
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            _, _, native = heapq.heappop(self._held)
            native.requeue()

    def _requeue_held(self) -> None:
        held, self._held = self._held, []
        for _, _, native in held:
            try:
                native.requeue()
            except Exception as exc:  # the channel is gone: the broker requeues anyway
                self.log.warning("requeue_failed", queue=self.queue_name, error=repr(exc))
                return

    def _drop_connection(self) -> None:
        self._held.clear()
        self._inbox.clear()
        if self._conn is not None:
            try:
                self._conn.release()
            except Exception as exc:
                self.log.warning("connection_close_failed", error=repr(exc))
            self._conn = None
            self._producer = None


def _attempt_key(message: Message, outcome: Outcome) -> str:
    if outcome.key is not None:
        return f"{outcome.tenant}\x00{outcome.key}"
    return f"{message.message_id}\x00{message.offset}"


__all__ = ["RabbitMQConsumerLoop", "to_message"]
