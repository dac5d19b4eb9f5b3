"""The retry of a failed message is enqueued before the original is acked, or the original stays.

Dramatiq's ``Retries`` middleware re-enqueues a message whose actor raised from its
``after_process_message`` hook, and the worker acks the original right after.  When that
re-enqueue raises — the broker unreachable at that instant — Dramatiq logs the error
(``emit_after`` swallows it) and acks the original all the same: nothing will ever deliver that
message again.  On the Redis broker this is what happens whenever Redis is down at that moment
(Dramatiq retries the *ack* until Redis is back); on RabbitMQ whenever the publishing connection
fails while the consumer's connection still carries the ack.  And a RabbitMQ publish without
publisher confirms can vanish silently in a connection the broker is closing.

For idempotent actors this module closes both gaps:

* when a worker boots, publisher confirms are switched on for a RabbitMQ broker
  (``confirm_delivery``), so an enqueue returns only once RabbitMQ holds the message (and
  raises otherwise, which Dramatiq's enqueue retries on a fresh connection);
* per worker thread, :class:`RetryGuard` follows the message whose actor raised and the
  enqueue of its retry (``before_enqueue`` / ``after_enqueue`` with a delay, same message id);
* in ``before_ack`` — after every ``after_process_message`` hook, just before the ack — a retry
  that was not enqueued is enqueued again, with backoff, until it is.  Only when the worker
  shuts down meanwhile does it give up: it raises from ``before_ack``, which makes Dramatiq skip
  the ack, so the broker delivers the original again (RabbitMQ when the connection closes,
  Redis once the worker's heartbeat is older than ``heartbeat_timeout``).

A retry enqueued twice (a confirm lost with its connection) is harmless: the scope's record
decides what the second copy does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from dramatiq.middleware import MiddlewareError

from .._core.logging import Logger

#: The delay (ms) of a retry re-enqueued when Retries never got as far as trying.
FALLBACK_DELAY_MS = 1000
#: Backoff (s) between the guard's own attempts: first, and at most (Dramatiq retries a failed
#: ack every 5 s).
FIRST_WAIT, MAX_WAIT = 0.5, 5.0


class RetryNotEnqueuedError(MiddlewareError):
    """The retry of a message could not be enqueued before the worker shut down; raised from
    ``before_ack`` so that Dramatiq leaves the original unacked (the broker delivers it again)."""


@dataclass
class _Pending:
    """The message of this thread whose actor raised, and what became of its retry."""

    message_id: str
    delay: int | None = None  # the delay Retries asked for (seen in ``before_enqueue``)
    enqueued: bool = False  # ``after_enqueue`` came: the broker has the retry


class _Local(threading.local):
    pending: _Pending | None = None


class RetryGuard:
    """Follows one failed message per worker thread until its retry is enqueued (module
    docstring)."""

    def __init__(self, log: Logger) -> None:
        self.log = log
        self._local = _Local()
        self._stopping = threading.Event()

    # -- the hooks -----------------------------------------------------------------------------
    def expect_retry(self, message: Any) -> None:
        """The actor of ``message`` raised: Retries will re-enqueue it, or fail it."""
        self._local.pending = _Pending(message.message_id)

    def enqueue_started(self, message: Any, delay: int | None) -> None:
        pending = self._match(message)
        if pending is not None and delay is not None:
            pending.delay = delay

    def enqueue_done(self, message: Any, delay: int | None) -> None:
        pending = self._match(message)
        if pending is not None and delay is not None:
            pending.enqueued = True

    def before_ack(self, broker: Any, message: Any) -> None:
        """Let the ack through only once the retry of a failed message is enqueued."""
        pending = self._match(message)
        self._local.pending = None
        if pending is None or pending.enqueued:
            return
        self._enqueue_until_done(broker, message, pending.delay or FALLBACK_DELAY_MS)

    def forget(self, message: Any) -> None:
        """The message is being nacked (dead-lettered): no retry is owed."""
        if self._match(message) is not None:
            self._local.pending = None

    def resume(self) -> None:
        self._stopping.clear()

    def stop(self) -> None:
        """The worker shuts down: stop retrying enqueues (the originals stay unacked)."""
        self._stopping.set()

    # -- internals ---------------------------------------------------------------------------
    def _match(self, message: Any) -> _Pending | None:
        pending = self._local.pending
        if pending is not None and pending.message_id == message.message_id:
            return pending
        return None

    def _enqueue_until_done(self, broker: Any, message: Any, delay: int) -> None:
        wait, attempt = FIRST_WAIT, 0
        while True:
            attempt += 1
            try:
                broker.enqueue(message, delay=delay)
            except Exception as exc:
                self.log.warning("dramatiq_retry_not_enqueued", message_id=message.message_id,
                                 attempt=attempt, error=repr(exc))
            else:
                self.log.warning("dramatiq_retry_reenqueued", message_id=message.message_id,
                                 attempts=attempt)
                return
            if self._stopping.wait(wait):
                self.log.error("dramatiq_retry_left_unacked", message_id=message.message_id)
                raise RetryNotEnqueuedError(
                    f"the retry of message {message.message_id} could not be enqueued before "
                    "the worker shut down; the original is left unacked for redelivery"
                )
            wait = min(wait * 2, MAX_WAIT)


def enable_publisher_confirms(broker: Any, log: Logger) -> None:
    """RabbitMQ: make every enqueue of this worker wait for the broker's confirm."""
    if getattr(broker, "confirm_delivery", None) is False:
        broker.confirm_delivery = True
        log.info("dramatiq_publisher_confirms_enabled", broker=type(broker).__name__)


__all__ = ["RetryGuard", "RetryNotEnqueuedError", "enable_publisher_confirms"]
