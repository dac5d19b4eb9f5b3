"""Signals a body raises to say what its attempt means when neither "success" nor the
``permanent=`` classification of an exception says it.

* :class:`Poison` — the attempt failed permanently *and* produced a value worth keeping
  (an HTTP error response, a validation report): the scope is marked FAILED with the value
  stored in the record's ``response``; every later delivery gets ``kind="poisoned"`` with
  that value as ``Outcome.result`` (``unwrap()`` still raises ``REQUEST_FAILED``).
* :class:`Release` — the attempt is not the operation's outcome at all (the caller was
  not allowed to run it: missing credentials, a CSRF refusal): the scope is released
  without counting a failure and without poisoning, so a corrected retry runs; the
  outcome is ``kind="failed"`` with the counter unchanged.

Both are ordinary exceptions raised *inside* the body; the engine recognises them whatever
``permanent=`` says.  They are general (nothing here knows HTTP): the HTTP middlewares use
them for recorded error responses and for 401/403/407.
"""

from __future__ import annotations

from typing import Any


class Poison(Exception):
    """Fail the attempt permanently and keep ``value`` with the FAILED record.

    ``value`` is serialised like a result (the handler's serializer and
    ``max_response_bytes``); a value that cannot be stored poisons the scope without one
    (logged as ``poison_value_not_stored``).  ``None`` keeps nothing: a plain poison.
    """

    def __init__(self, value: Any, message: str = "the body failed permanently") -> None:
        super().__init__(message)
        self.value = value


class Release(Exception):
    """Release the scope without counting or poisoning: this attempt did not count."""

    def __init__(self, reason: str = "released") -> None:
        super().__init__(reason)
        self.reason = reason


__all__ = ["Poison", "Release"]
