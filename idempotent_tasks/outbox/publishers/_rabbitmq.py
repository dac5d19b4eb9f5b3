"""Staged RabbitMQ publishes, on one channel with publisher confirms (py-amqp).

A batch is published without waiting in between (``mandatory``, persistent), then the relay
waits for the broker's confirms of all of it: one round trip per batch, not per message.
Every message carries the headers ``idempotency-key`` / ``idempotency-tenant`` (what the
RabbitMQ consumer loop reads) and the staged key as its ``message_id``.

Per message: acked → ``sent``; returned as unroutable (``mandatory``) or nacked →
``rejected``.  A channel the broker closes (a publish to a missing exchange: 404) answers for
the first unconfirmed message (``rejected``) and leaves the rest ``deferred``; a lost
connection leaves every unconfirmed message ``unavailable``, and the next batch reconnects.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ..._core.keys import KEY_HEADER, TENANT_HEADER
from ._base import DEFERRED, SENT, PublishResult, rejected, unavailable

if TYPE_CHECKING:
    from .._table import OutboxRow

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"


def connection_options(url: str) -> dict[str, Any]:
    """py-amqp's ``Connection`` arguments for an ``amqp://user:pass@host:port/vhost`` URL."""
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
    return {"host": f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
            "userid": unquote(parts.username or "guest"),
            "password": unquote(parts.password or "guest"), "virtual_host": vhost}


class _Batch:
    """The confirms and returns of one published batch."""

    def __init__(self, rows: Sequence[OutboxRow], first_tag: int) -> None:
        self.first_tag = first_tag
        self.index = {row.key: i for i, row in enumerate(rows)}
        self.results: list[PublishResult | None] = [None] * len(rows)
        self.published = 0

    def confirmed(self, tag: int, multiple: bool, ok: bool) -> None:
        last = tag - self.first_tag
        first = 0 if multiple else last
        for i in range(max(first, 0), min(last + 1, self.published)):
            if self.results[i] is None:
                self.results[i] = SENT if ok else rejected("nacked by the broker")

    def returned(self, exc: Any, message: Any) -> None:
        i = self.index.get(str(message.properties.get("message_id")))
        if i is not None:
            self.results[i] = rejected(f"returned by the broker: {exc}")

    def open(self) -> bool:
        return any(r is None for r in self.results[: self.published])


class RabbitMQPublisher:
    """Publishes ``rabbitmq`` rows to the broker at ``url`` (one connection, reused)."""

    kind = "rabbitmq"

    def __init__(self, url: str = DEFAULT_URL, *, confirm_timeout: float = 30.0,
                 connect_timeout: float = 5.0) -> None:
        self.url = url
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self._conn: Any = None
        self._channel: Any = None
        self._tag = 0
        self._batch: _Batch | None = None

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        import amqp  # type: ignore[import-untyped]

        try:
            channel = self._open()
        except (OSError, amqp.exceptions.AMQPError) as exc:
            self._reset()
            return [unavailable(exc)] * len(rows)
        batch = self._batch = _Batch(rows, self._tag + 1)
        try:
            with _one_write(self._conn.transport):
                for row in rows:
                    channel.basic_publish(_message(amqp, row), exchange=row.fields["exchange"],
                                          routing_key=row.fields["routing_key"], mandatory=True)
                    self._tag += 1
                    batch.published += 1
            self._wait(batch)
        except amqp.exceptions.ChannelError as exc:
            self._channel_closed(batch, exc)
        except (OSError, amqp.exceptions.AMQPError) as exc:
            self._reset()
            return [r if r is not None else unavailable(exc) for r in batch.results]
        finally:
            self._batch = None
        return [r if r is not None else DEFERRED for r in batch.results]

    def _wait(self, batch: _Batch) -> None:
        deadline = time.monotonic() + self.confirm_timeout
        while batch.open():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no publisher confirm within confirm_timeout")
            try:
                self._conn.drain_events(timeout=min(left, 1.0))
            except TimeoutError:
                continue

    def _channel_closed(self, batch: _Batch, exc: BaseException) -> None:
        """The broker closed the channel (e.g. 404 on the exchange): the first unconfirmed
        message caused it; the others are tried again in the next batch."""
        self._channel = None
        for i in range(batch.published):
            if batch.results[i] is None:
                batch.results[i] = rejected(exc)
                break

    def _open(self) -> Any:
        import amqp

        if self._conn is None or not self._conn.connected:
            self._reset()
            conn = amqp.Connection(**connection_options(self.url),
                                   connect_timeout=self.connect_timeout,
                                   confirm_publish=False)
            conn.connect()
            self._conn = conn
        if self._channel is None or not self._channel.is_open:
            channel = self._conn.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(lambda tag, many: self._confirm(tag, many, True))
            channel.events["basic_nack"].add(lambda tag, many: self._confirm(tag, many, False))
            channel.events["basic_return"].add(self._returned)
            self._channel, self._tag = channel, 0
        return self._channel

    def _confirm(self, tag: int, multiple: bool, ok: bool) -> None:
        if self._batch is not None:
            self._batch.confirmed(tag, multiple, ok)

    def _returned(self, exc: Any, _exchange: str, _routing_key: str, message: Any) -> None:
        if self._batch is not None:
            self._batch.returned(exc, message)

    def _reset(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection: nothing left to release
                conn.collect()

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                conn.collect()


@contextlib.contextmanager
def _one_write(transport: Any) -> Iterator[None]:
    """The frames of a whole batch in one socket write instead of one per message (py-amqp
    writes each frame with its own ``sendall``: a system call per message).  The transport's
    ``_write`` is swapped for a buffer while the batch is framed, then the buffer is written
    through the transport's own ``write`` (its error handling included)."""
    if not hasattr(transport, "_write"):  # pragma: no cover - another py-amqp: unbuffered
        yield
        return
    own = "_write" in vars(transport)
    original = vars(transport).get("_write")
    buffer = bytearray()
    transport._write = buffer.extend  # each frame is copied out of py-amqp's shared buffer
    try:
        yield
    finally:
        if own:
            transport._write = original
        else:
            del transport._write
        if buffer:
            transport.write(bytes(buffer))


def _message(amqp: Any, row: OutboxRow) -> Any:
    fields = row.fields
    headers = {**(fields.get("headers") or {}), KEY_HEADER: row.key, TENANT_HEADER: row.tenant}
    properties = {k: v for k, v in (fields.get("properties") or {}).items() if v is not None}
    if fields.get("content_type"):
        properties["content_type"] = fields["content_type"]
    return amqp.Message(row.body or b"", application_headers=headers, message_id=row.key,
                        delivery_mode=2, **properties)


__all__ = ["DEFAULT_URL", "RabbitMQPublisher", "connection_options"]
