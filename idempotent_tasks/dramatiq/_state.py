"""Per-thread hand-offs between the middleware hooks, the wrapped actor and ``retry_when``.

Dramatiq runs ``before_process_message``, the actor and every ``after_*`` hook of one
message on the same worker thread, so a ``threading.local`` is the narrowest channel:

* ``message`` — the message being processed, handed from ``before_process_message`` to the
  wrapped actor, which *takes* it (a direct call of the actor from inside a body therefore
  never picks up its caller's message);
* ``decision`` — what the wrapped actor decided for the exception it raised, read by the
  ``retry_when`` policy that the Retries middleware consults (matched by identity, so an
  exception raised elsewhere never borrows it).

The SQLAlchemy connection of a ``transactional=True`` body is a ``ContextVar`` instead, so
that it follows the body into nested calls and never leaks to another thread.
"""

from __future__ import annotations

import enum
import threading
from contextvars import ContextVar
from typing import Any


class Decision(enum.Enum):
    """What happens to a message whose actor raised."""

    RETRY = "retry"  # Dramatiq's Retries re-enqueues it (with the actor's backoff)
    DEAD_LETTER = "dead_letter"  # the message fails: no retry, the broker dead-letters it


class _Local(threading.local):
    message: Any = None
    decision: tuple[BaseException, Decision] | None = None


local = _Local()

connection: ContextVar[Any] = ContextVar("idempotent_tasks_dramatiq_connection", default=None)


def take_message(actor_name: str) -> Any:
    """The message being processed for ``actor_name`` on this thread, at most once."""
    message = local.message
    if message is None or message.actor_name != actor_name:
        return None
    local.message = None
    return message


def remember(exc: BaseException, decision: Decision) -> None:
    local.decision = (exc, decision)


def decision_for(exc: BaseException) -> Decision | None:
    pending = local.decision
    if pending is not None and pending[0] is exc:
        return pending[1]
    return None


def clear() -> None:
    local.message = None
    local.decision = None
