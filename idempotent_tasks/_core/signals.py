"""Signals a body raises to say what its attempt means when neither "success" nor the
``permanent=`` classification of an exception says it.

* :class:`Poison` — the attempt failed permanently, optionally with a value worth keeping
  (an HTTP error response, a validation report): the scope is marked FAILED with the value
  stored in the record's ``response``; every later delivery gets ``kind="poisoned"`` with
  that value as ``Outcome.result`` (``unwrap()`` still raises ``REQUEST_FAILED``).
* :class:`Release` — release the scope for a retry, whatever ``permanent=`` says: counted
  like a transient failure (``Release()``), or, with ``counted=False``, because the attempt
  is not the operation's outcome at all (the caller was not allowed to run it: missing
  credentials, a CSRF refusal): released without counting and without poisoning, so a
  corrected retry runs; the outcome is ``kind="failed"`` with the counter unchanged.
* :class:`Abandon` — walk away from the attempt exactly as a killed worker does: nothing is
  written, the record stays PROCESSING with its fencing token and its lease, and the
  exception propagates out of ``run`` / ``execute``.  Once the lease expires, recovery or the
  next delivery's takeover counts the abandoned attempt.  For tests of what follows a crash
  inside a body (``idempotent_tasks.testing.simulate_crash`` is built on it); in production
  it only blocks the scope for a whole lease — raise :class:`Release` to give it up.

Import them from ``idempotent_tasks`` (``from idempotent_tasks import Poison, Release``).

``Poison`` and ``Release`` are ordinary exceptions raised *inside* the body; the engine
recognises them whatever ``permanent=`` says.  ``Abandon`` is a ``BaseException`` (like
``KeyboardInterrupt``), so that no ``except Exception`` between the body and the worker
turns the crash into an answer.  They are general (nothing here knows HTTP): the HTTP
middlewares use ``Poison`` and ``Release`` for recorded error responses and for 401/403/407.
"""

from __future__ import annotations

from typing import Any


class Poison(Exception):
    """Fail the attempt permanently and keep ``result`` with the FAILED record.

    ``result`` is serialised like a body's return value (the handler's serializer and
    ``max_response_bytes``); a value that cannot be stored poisons the scope without one
    (logged as ``poison_value_not_stored``).  ``None`` (the default) keeps nothing: a plain
    poison, whatever ``permanent=`` says.
    """

    def __init__(self, result: Any = None, message: str = "the body failed permanently") -> None:
        super().__init__(message)
        self.result = result

    @property
    def value(self) -> Any:
        """``result``, by its earlier name."""
        return self.result

    @value.setter
    def value(self, result: Any) -> None:
        self.result = result


class Release(Exception):
    """Release the scope for a retry, whatever ``permanent=`` says.

    ``Release()`` is a counted release: the attempt counts like a transient failure (the
    scope's counter goes up, and reaching ``max_retries`` poisons).  ``Release(counted=False)``
    frees the scope without counting or poisoning: the attempt was not the operation's
    outcome at all (the HTTP middlewares raise it for 401/403/407).
    """

    #: Whether the attempt counts (a subclass may set it for all its instances).
    counted: bool = True

    def __init__(self, reason: str = "released", *, counted: bool | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if counted is not None:
            self.counted = counted


class Abandon(BaseException):
    """Leave the attempt as a SIGKILLed worker leaves it: no outcome is written, the claim
    stays PROCESSING with its token until its lease expires, and this propagates.

    A real crash cannot be produced inside one process without killing it; this is the
    same record state, reached through the public ``run`` so that tests need no private
    engine step.  Nothing is counted or logged: a killed worker says nothing either.
    """

    def __init__(self, reason: str = "abandoned") -> None:
        super().__init__(reason)
        self.reason = reason


__all__ = ["Abandon", "Poison", "Release"]
