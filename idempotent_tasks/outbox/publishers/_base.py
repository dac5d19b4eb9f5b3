"""The publisher contract: one call per batch, one result per row.

A publisher hands a batch of rows to its broker and says, for each row, what happened:

=============  ==================================================================  ===========
state          meaning                                                             the relay
=============  ==================================================================  ===========
``sent``       the broker confirmed it (publisher confirms, ``acks=all``, …)       marks SENT
``rejected``   the broker refused *this* message (no route, too large, …)          counts an
                                                                                   attempt
``deferred``   not attempted, or its fate is unknown, because of another row's     nothing:
               failure (a closed channel)                                          next batch
``unavailable``the broker could not be reached                                     backs off
=============  ==================================================================  ===========

A publisher never reports ``sent`` for a message the broker did not confirm: everything the
relay marks SENT was durably accepted.  The converse does not hold — a confirmation lost on
the way back makes the relay publish that row again — which is why every message carries its
idempotency key (at-least-once publishing, exactly-once processing at the receiver).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol

if TYPE_CHECKING:
    from .._table import OutboxRow

State = Literal["sent", "rejected", "deferred", "unavailable"]


@dataclass(frozen=True, slots=True)
class PublishResult:
    state: State
    error: str | None = None


SENT: Final = PublishResult("sent")
DEFERRED: Final = PublishResult("deferred")


def rejected(error: BaseException | str) -> PublishResult:
    return PublishResult("rejected", _describe(error))


def unavailable(error: BaseException | str) -> PublishResult:
    return PublishResult("unavailable", _describe(error))


def _describe(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return text[:2000]


class Publisher(Protocol):
    """Publishes rows of one ``kind`` ("celery", "dramatiq", "kafka", "rabbitmq")."""

    kind: str

    def publish(self, rows: Sequence[OutboxRow]) -> list[PublishResult]:
        """One result per row, in order; never raises for a broker failure."""
        ...

    def close(self) -> None: ...


__all__ = ["DEFERRED", "SENT", "PublishResult", "Publisher", "State", "rejected", "unavailable"]
