"""The broker-neutral message and the header conventions (the per-message outcome is the
engine's one :class:`~idempotent_tasks.Outcome`).

Header names are matched case-insensitively and ``-`` and ``_`` are interchangeable, so
``Idempotency-Key``, ``idempotency_key`` and ``IDEMPOTENCY-KEY`` are one header.  Values are
handed to the handler's validation untouched (after the loops decode bytes as UTF-8), so
hostile values — bytes that are not UTF-8, NUL and other control characters, values longer
than 255 characters — end as ``"rejected"`` outcomes with ``INVALID_KEY`` / ``INVALID_TENANT``,
never as exceptions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core import keys
from .._core.errors import ErrorCode
from .._core.outcome import Outcome

KEY_HEADER = keys.KEY_HEADER
TENANT_HEADER = keys.TENANT_HEADER
ERROR_CODE_HEADER = "idempotency-error-code"
ERROR_HEADER = "idempotency-error"
ORIGINAL_TOPIC_HEADER = "idempotency-original-topic"
ORIGINAL_PARTITION_HEADER = "idempotency-original-partition"
ORIGINAL_OFFSET_HEADER = "idempotency-original-offset"
#: Headers a dead letter gets from the loop; stale copies from an earlier trip are replaced.
DEAD_LETTER_HEADERS: frozenset[str] = frozenset({
    ERROR_CODE_HEADER, ERROR_HEADER, ORIGINAL_TOPIC_HEADER, ORIGINAL_PARTITION_HEADER,
    ORIGINAL_OFFSET_HEADER,
})


@functools.lru_cache(maxsize=4096)  # header names repeat on every message
def normalize_header_name(name: str) -> str:
    """``Idempotency_Key`` → ``idempotency-key``: the form every look-up uses."""
    return name.lower().replace("_", "-")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery, whatever the broker.

    ``value`` is the raw body (``bytes`` from the loops; ``str`` or an already decoded value
    are accepted too).  ``key`` is the broker's message key (Kafka key, AMQP routing key).
    For RabbitMQ ``topic`` holds the queue name and ``offset`` the delivery tag.
    """

    value: Any
    headers: Mapping[str, Any] | None = None
    key: Any = field(default=None, kw_only=True)
    topic: str | None = field(default=None, kw_only=True)
    partition: int | None = field(default=None, kw_only=True)
    offset: int | None = field(default=None, kw_only=True)
    message_id: str | None = field(default=None, kw_only=True)
    content_type: str | None = field(default=None, kw_only=True)

    def header(self, name: str) -> Any:
        """The value of header ``name`` (case-insensitive, ``-`` or ``_``), or ``None``.

        When several spellings of one name are present the first one in the mapping wins.
        """
        if not self.headers:
            return None
        wanted = normalize_header_name(name)
        for raw, value in self.headers.items():
            if isinstance(raw, str) and normalize_header_name(raw) == wanted:
                return value
        return None


def header_text(value: Any) -> Any:
    """How the loops turn a broker header value into ``Message.headers``.

    Bytes are decoded as UTF-8; bytes that are not UTF-8 keep their undecodable bytes as lone
    surrogates (``surrogateescape``), which validation refuses as ``INVALID_*`` — so a hostile
    header is rejected instead of silently turned into a different, valid key.  Numbers
    become their decimal text (AMQP producers send typed values); other values are kept.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return value


def dead_letter_headers(message: Message, outcome: Outcome) -> dict[str, str]:
    """The ``idempotency-*`` headers every dead letter carries (Kafka and RabbitMQ alike).

    ``idempotency-original-partition`` is only set when the broker has partitions.
    """
    headers = {
        ERROR_CODE_HEADER: (outcome.error_code or ErrorCode.INTERNAL_ERROR).value,
        ORIGINAL_TOPIC_HEADER: message.topic or "",
        ORIGINAL_OFFSET_HEADER: "" if message.offset is None else str(message.offset),
    }
    if message.partition is not None:
        headers[ORIGINAL_PARTITION_HEADER] = str(message.partition)
    if outcome.error is not None:
        headers[ERROR_HEADER] = outcome.error
    return headers
