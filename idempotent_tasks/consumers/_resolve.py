"""Where a message's key, tenant and payload come from (docs/consumers.md).

Key, in order: a ``key=`` function of the message; else the ``idempotency-key`` header; else
the CloudEvents ``source`` + ``id`` (binary mode: ``ce_source``/``ce_id`` Kafka headers or
``cloudEvents:source``/``cloudEvents:id`` AMQP headers; structured mode: the
``application/cloudevents+json`` envelope).  ``key="coordinates"`` opts in to the delivery's
coordinates instead — (topic, partition, offset) or the broker's message id — which dedupe
broker redeliveries but *not* a producer's retries (a re-sent message has a new offset).

The CloudEvents key is ``ce:<len(source)>:<source><id>``: the length prefix makes it
collision-free (``("a/b", "c")`` and ``("a", "/bc")`` never share a key) and ids are unique
per source, which is the CloudEvents rule.

Anything here that cannot be resolved raises :class:`InvalidInputError` with the right code;
the consumer turns it into a ``"rejected"`` outcome.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._core.errors import ErrorCode, IdempotencyError, InvalidInputError
from ._message import KEY_HEADER, TENANT_HEADER, Message

CLOUDEVENTS_CONTENT_TYPE = "application/cloudevents+json"
_scanner = getattr(json.scanner, "c_make_scanner", None)
_scan: Callable[[str, int], tuple[Any, int]] | None = (
    None if _scanner is None else _scanner(json.JSONDecoder())
)
_BINARY_SOURCE = ("ce_source", "cloudEvents:source", "cloudEvents_source")
_BINARY_ID = ("ce_id", "cloudEvents:id", "cloudEvents_id")

KeySpec = Callable[[Message], Any] | Literal["coordinates"] | None
TenantSpec = Callable[[Message], Any] | None
PayloadSpec = Callable[[Message], Any] | None


@dataclass(slots=True)
class Resolved:
    """A message's idempotency inputs, not yet validated (the handler validates)."""

    tenant: Any
    key: Any
    payload: Any


def cloudevents_key(source: Any, event_id: Any) -> str | None:
    """``ce:<len(source)>:<source><id>`` when both are present text, else ``None``."""
    if not isinstance(source, str) or not isinstance(event_id, str):
        return None
    if not source or not event_id:
        return None
    return f"ce:{len(source)}:{source}{event_id}"


def is_structured_cloudevent(message: Message) -> bool:
    content_type = message.content_type or message.header("content-type")
    if not isinstance(content_type, str):
        return False
    return content_type.split(";", 1)[0].strip().lower() == CLOUDEVENTS_CONTENT_TYPE


def decode_json(value: Any, what: str = "message value") -> Any:
    """The message value decoded as JSON; ``None`` stays ``None`` (a Kafka tombstone)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"{what} is not UTF-8", code=ErrorCode.INVALID_PAYLOAD
            ) from exc
    if not isinstance(value, str):
        return value  # already decoded by the caller
    try:
        value_end = _scan(value, 0) if _scan is not None and value else None
        if value_end is not None and value_end[1] == len(value):
            return value_end[0]  # one JSON value, no surrounding whitespace: the C scanner
        return json.loads(value)
    except StopIteration:  # the scanner found no value at 0: let json say why
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise InvalidInputError(
                f"{what} is not valid JSON: {type(exc).__name__}",
                code=ErrorCode.INVALID_PAYLOAD,
            ) from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(
            f"{what} is not valid JSON: {type(exc).__name__}", code=ErrorCode.INVALID_PAYLOAD
        ) from exc


def structured_envelope(message: Message) -> dict[str, Any]:
    envelope = decode_json(message.value, "CloudEvents envelope")
    if not isinstance(envelope, dict):
        raise InvalidInputError(
            "a structured CloudEvent must be a JSON object", code=ErrorCode.INVALID_PAYLOAD
        )
    return envelope


def _first_header(message: Message, names: tuple[str, ...]) -> Any:
    for name in names:
        value = message.header(name)
        if value is not None:
            return value
    return None


def binary_cloudevents_key(message: Message) -> str | None:
    return cloudevents_key(
        _first_header(message, _BINARY_SOURCE), _first_header(message, _BINARY_ID)
    )


def coordinates_key(message: Message) -> str | None:
    """``<topic>/<partition>/<offset>`` (Kafka), else the broker's message id."""
    if message.topic is not None and message.partition is not None and message.offset is not None:
        return f"{message.topic}/{message.partition}/{message.offset}"
    if message.message_id:
        return message.message_id
    return None


def call_user_function(
    fn: Callable[[Message], Any], message: Message, what: str, missing: ErrorCode,
    invalid: ErrorCode,
) -> Any:
    """A user's extraction function: a missing field (``LookupError``) is ``missing``; any
    other error ``invalid`` — bad input from the message, never a crash of the loop."""
    try:
        return fn(message)
    except IdempotencyError:
        raise
    except LookupError as exc:
        raise InvalidInputError(f"{what} not found: {exc!r}", code=missing) from exc
    except Exception as exc:
        raise InvalidInputError(f"{what} function failed: {exc!r}", code=invalid) from exc


class Resolver:
    """Turns a :class:`Message` into (tenant, key, payload) following the conventions."""

    def __init__(
        self,
        *,
        key: KeySpec,
        tenant: TenantSpec,
        payload: PayloadSpec,
        default_tenant: str | None,
    ) -> None:
        self.key = key
        self.tenant = tenant
        self.payload = payload
        self.default_tenant = default_tenant

    def resolve(self, message: Message) -> Resolved:
        envelope = structured_envelope(message) if is_structured_cloudevent(message) else None
        return Resolved(
            tenant=self._tenant(message),
            key=self._key(message, envelope),
            payload=self._payload(message, envelope),
        )

    def _tenant(self, message: Message) -> Any:
        if self.tenant is not None:
            return call_user_function(
                self.tenant, message, "tenant", ErrorCode.MISSING_TENANT,
                ErrorCode.INVALID_TENANT,
            )
        value = message.header(TENANT_HEADER)
        return value if value is not None else self.default_tenant

    def _key(self, message: Message, envelope: dict[str, Any] | None) -> Any:
        if callable(self.key):
            return call_user_function(
                self.key, message, "idempotency key", ErrorCode.MISSING_KEY,
                ErrorCode.INVALID_KEY,
            )
        if self.key == "coordinates":
            return coordinates_key(message)
        value = message.header(KEY_HEADER)
        if value is not None:
            return value
        if envelope is not None:
            return cloudevents_key(envelope.get("source"), envelope.get("id"))
        return binary_cloudevents_key(message)

    def _payload(self, message: Message, envelope: dict[str, Any] | None) -> Any:
        if self.payload is not None:
            return call_user_function(
                self.payload, message, "payload", ErrorCode.INVALID_PAYLOAD,
                ErrorCode.INVALID_PAYLOAD,
            )
        if envelope is not None:
            if "data" in envelope:
                return envelope["data"]
            return envelope.get("data_base64")
        return decode_json(message.value)
