"""What a staged message is: a Celery task, a Dramatiq message, a Kafka record or a RabbitMQ
publish — small frozen values with the fields each broker's users know.

Each target reduces to the row's ``kind``, a human-readable ``destination`` (task name,
``queue/actor``, topic, ``exchange/routing_key``: what ``idempotent-tasks outbox list``
shows), a JSON ``fields`` document and, for Kafka and RabbitMQ, the raw ``body`` bytes.  The
idempotency key and tenant are *not* fields: the relay adds them to every message (Celery
headers ``idempotency_key`` / ``idempotency_tenant``, Dramatiq options, Kafka and AMQP
headers ``idempotency-key`` / ``idempotency-tenant``), and Celery task ids and Dramatiq
message ids are the staged key, so a republished message is the same message to the receiver.

A Celery ``Signature`` (``task.s(...)``, ``task.si(...)``) and a Dramatiq ``Message``
(``actor.message(...)``) can be sent as they are; :func:`as_target` converts them.  Their
arguments must be JSON-serialisable (the library's JSON: datetimes, Decimals and UUIDs become
strings): they are stored as JSON and handed to the broker by the relay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .._core.errors import ConfigurationError
from .._core.serialization import _default


def _encoder() -> Callable[[Any], str]:
    """The library's JSON (datetimes, Decimals, UUIDs, Enums, dataclasses, pydantic models)
    without the canonical form's sorting and key checks: a message is encoded, never hashed.
    The C encoder is built once (``JSONEncoder.encode`` builds one per call)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - no C accelerator
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                                default=_default).encode
    encode = make(None, _default, json.encoder.encode_basestring, None, ":", ",", False, False,
                  False)
    return lambda value: "".join(encode(value, 0))


_ENCODE: Final = _encoder()


def dumps(value: Any) -> bytes:
    """``value`` as the library's JSON; what it cannot encode is the caller's error."""
    try:
        return _ENCODE(value).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(f"a staged message must be JSON-serialisable: {exc}") from exc


Kind = Literal["celery", "dramatiq", "kafka", "rabbitmq"]
KINDS: Final[tuple[Kind, ...]] = ("celery", "dramatiq", "kafka", "rabbitmq")

#: Celery ``apply_async`` options a staged task may carry (all JSON values).
CELERY_OPTIONS: Final = frozenset({
    "queue", "routing_key", "exchange", "priority", "countdown", "expires", "headers",
    "time_limit", "soft_time_limit", "shadow",
})
#: AMQP basic properties a RabbitMQ publish may carry.
AMQP_PROPERTIES: Final = frozenset({
    "content_encoding", "priority", "correlation_id", "reply_to", "expiration", "type",
    "app_id", "user_id",
})


@dataclass(frozen=True, slots=True)
class CeleryTask:
    """``app.send_task(name, args, kwargs, **options)``: a task by name (the receiving
    worker's app need not be importable by the sender)."""

    name: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    kind: Kind = field(default="celery", init=False)

    @property
    def destination(self) -> str:
        return self.name

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, "args": list(self.args), "kwargs": dict(self.kwargs),
                "options": dict(self.options)}


@dataclass(frozen=True, slots=True)
class DramatiqMessage:
    """``broker.enqueue(Message(queue_name, actor_name, args, kwargs, options), delay=...)``."""

    actor_name: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue_name: str = "default"
    options: Mapping[str, Any] = field(default_factory=dict)
    delay: int | None = None  # milliseconds, as Dramatiq's ``send_with_options(delay=...)``
    kind: Kind = field(default="dramatiq", init=False)

    @property
    def destination(self) -> str:
        return f"{self.queue_name}/{self.actor_name}"

    def fields(self) -> dict[str, Any]:
        return {"actor_name": self.actor_name, "queue_name": self.queue_name,
                "args": list(self.args), "kwargs": dict(self.kwargs),
                "options": dict(self.options), "delay": self.delay}


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """``producer.produce(topic, value, key, headers=..., partition=...)``.  Without a
    ``key``, the parent scope's hash is the record key, so one parent's records share a
    partition (and so their order)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    partition: int | None = None
    kind: Kind = field(default="kafka", init=False)

    @property
    def destination(self) -> str:
        return self.topic

    def fields(self) -> dict[str, Any]:
        return {"topic": self.topic, "key": _text_of(self.key), "partition": self.partition,
                "headers": {k: _text_of(v) for k, v in self.headers.items()}}


@dataclass(frozen=True, slots=True)
class RabbitMQMessage:
    """``basic_publish(body, exchange, routing_key)`` with persistent delivery, the given
    headers and AMQP properties; the message id is the staged key."""

    body: bytes
    routing_key: str
    exchange: str = ""
    headers: Mapping[str, Any] = field(default_factory=dict)
    content_type: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)
    kind: Kind = field(default="rabbitmq", init=False)

    @property
    def destination(self) -> str:
        return f"{self.exchange or '(default)'}/{self.routing_key}"

    def fields(self) -> dict[str, Any]:
        return {"exchange": self.exchange, "routing_key": self.routing_key,
                "headers": dict(self.headers), "content_type": self.content_type,
                "properties": dict(self.properties)}


Target = CeleryTask | DramatiqMessage | KafkaRecord | RabbitMQMessage
_TARGETS: Final = frozenset({CeleryTask, DramatiqMessage, KafkaRecord, RabbitMQMessage})


# -- constructors ------------------------------------------------------------------------------
def celery_task(name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                **options: Any) -> CeleryTask:
    """A Celery task by name, with ``apply_async`` options (``queue``, ``countdown``,
    ``priority``, ``expires`` in seconds, ``headers``, …; see :data:`CELERY_OPTIONS`)."""
    unknown = set(options) - CELERY_OPTIONS
    if unknown:
        raise ConfigurationError(
            f"celery_task: unsupported options {sorted(unknown)} (supported: "
            f"{sorted(CELERY_OPTIONS)}; canvases and callbacks cannot be staged)"
        )
    return CeleryTask(name, tuple(args), dict(kwargs or {}), options)


def dramatiq_message(actor_name: str, args: Sequence[Any] = (),
                     kwargs: Mapping[str, Any] | None = None, *, queue_name: str = "default",
                     delay: int | None = None, **options: Any) -> DramatiqMessage:
    """A Dramatiq message for ``actor_name`` on ``queue_name`` (``delay`` in milliseconds;
    ``options`` as ``send_with_options`` takes them, e.g. ``max_retries``)."""
    return DramatiqMessage(actor_name, tuple(args), dict(kwargs or {}), queue_name, options,
                           delay)


def kafka_record(topic: str, value: Any, *, key: bytes | str | None = None,
                 headers: Mapping[str, bytes | str] | None = None,
                 partition: int | None = None) -> KafkaRecord:
    """A Kafka record; ``value``: bytes as they are, a ``str`` as UTF-8, anything else as
    the library's JSON (what ``IdempotentConsumer`` decodes by default)."""
    return KafkaRecord(topic, _bytes_of(value), _key_bytes(key),
                       {k: _key_bytes(v) or b"" for k, v in (headers or {}).items()}, partition)


def rabbitmq_message(body: Any, *, routing_key: str, exchange: str = "",
                     headers: Mapping[str, Any] | None = None, content_type: str | None = None,
                     **properties: Any) -> RabbitMQMessage:
    """A RabbitMQ publish (``exchange=""`` with ``routing_key=<queue>`` reaches a queue
    directly); ``body`` as for :func:`kafka_record`; AMQP ``properties`` such as
    ``correlation_id``, ``priority``, ``expiration`` (see :data:`AMQP_PROPERTIES`)."""
    unknown = set(properties) - AMQP_PROPERTIES
    if unknown:
        raise ConfigurationError(f"rabbitmq_message: unsupported properties {sorted(unknown)}")
    if content_type is None and not isinstance(body, bytes | str):
        content_type = "application/json"
    return RabbitMQMessage(_bytes_of(body) or b"", routing_key, exchange, dict(headers or {}),
                           content_type, properties)


def as_target(message: Any) -> Target:
    """A target, a Celery ``Signature`` or a Dramatiq ``Message`` as a target."""
    if type(message) in _TARGETS:
        return message  # type: ignore[no-any-return]
    module = type(message).__module__
    if module.startswith("celery") and hasattr(message, "task"):
        return _from_signature(message)
    if module.startswith("dramatiq") and hasattr(message, "actor_name"):
        # An absolute ``eta`` would be stale by the time the relay publishes: not kept (stage
        # a ``dramatiq_message(..., delay=ms)`` instead).
        options = {k: v for k, v in message.options.items() if k != "eta"}
        return DramatiqMessage(message.actor_name, tuple(message.args), dict(message.kwargs),
                               message.queue_name, options)
    raise ConfigurationError(
        f"cannot stage a {type(message).__name__}: send a celery_task(), dramatiq_message(), "
        "kafka_record(), rabbitmq_message(), a Celery signature or a Dramatiq message"
    )


def _from_signature(sig: Any) -> CeleryTask:
    if sig.get("chord") or sig.options.get("link") or sig.options.get("link_error") or (
        type(sig).__name__ != "Signature"
    ):
        raise ConfigurationError(
            "only a single Celery signature can be staged (no chains, groups, chords or links):"
            " stage each task, or let the receiving task continue the canvas"
        )
    options = {k: v for k, v in sig.options.items() if k in CELERY_OPTIONS}
    return celery_task(str(sig.task), tuple(sig.args), dict(sig.kwargs), **options)


def _bytes_of(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return dumps(value)


def _key_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def _text_of(value: bytes | None) -> str | None:
    """Kafka keys and header values are bytes: stored as Latin-1 text, which maps every byte
    to one code point and back (:func:`bytes_of_text`)."""
    return None if value is None else value.decode("latin-1")


def bytes_of_text(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def encode_fields(fields: Mapping[str, Any]) -> bytes:
    """A target's fields as stored in the row; arguments that cannot be encoded are the
    caller's error, raised at ``send``."""
    return dumps(fields)


def decode_fields(raw: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


__all__ = [
    "KINDS",
    "CeleryTask",
    "DramatiqMessage",
    "KafkaRecord",
    "Kind",
    "RabbitMQMessage",
    "Target",
    "as_target",
    "bytes_of_text",
    "celery_task",
    "decode_fields",
    "dramatiq_message",
    "encode_fields",
    "kafka_record",
    "rabbitmq_message",
]
