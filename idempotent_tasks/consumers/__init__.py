"""At-least-once consumers with exactly-once effects (docs/consumers.md).

:class:`IdempotentConsumer` turns one broker message into one :class:`Outcome`; the loops in
:mod:`idempotent_tasks.consumers.kafka` (confluent-kafka) and
:mod:`idempotent_tasks.consumers.rabbitmq` (kombu) commit / ack a message only after its
outcome is durable, dead-letter poisoned and rejected messages, and bring back the others
with backoff.  The broker modules import their driver lazily: importing this package needs
neither.
"""

from __future__ import annotations

from .._core.outcome import Outcome, OutcomeKind
from ._consumer import IdempotentConsumer
from ._loop import install_signal_handlers
from ._message import Message

__all__ = ["IdempotentConsumer", "Message", "Outcome", "OutcomeKind", "install_signal_handlers"]
