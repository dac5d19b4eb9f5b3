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

Import them from ``idempotent_tasks`` (``from idempotent_tasks import Poison, Release``).

Both are ordinary exceptions raised *inside* the body; the engine recognises them whatever
``permanent=`` says.  They are general (nothing here knows HTTP): the HTTP middlewares use
them for recorded error responses and for 401/403/407.
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


__all__ = ["Poison", "Release"]
