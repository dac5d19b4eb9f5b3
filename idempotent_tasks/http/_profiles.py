"""The two answer profiles of the HTTP middlewares, and the error bodies they write.

* ``"guide"`` (default): the production guide's statuses (``idempotency_error_status``:
  400 bad input, 409 key reused / in progress / poisoned, 503 store down) and the JSON body
  ``{"error": {"code", "message"}}``; error responses of the application are not kept
  (``replay_errors=False``), so a poisoned key answers ``409 REQUEST_FAILED``.
* ``"ietf"``: draft-ietf-httpapi-idempotency-key-header — 400 for a missing or invalid
  key, **422** for a key reused with another request, 409 while the first request is in
  flight; every error body is RFC 9457 ``application/problem+json`` with ``type`` (a URL
  per code, into docs/http.md), ``title``, ``status``, ``detail`` and ``code``; and a
  recorded error response is replayed (``replay_errors=True``).

``status_map`` overrides single codes on top of either profile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .._core.errors import ConfigurationError, ErrorCode, IdempotencyError

ProfileName = Literal["guide", "ietf"]
PROFILES: tuple[ProfileName, ...] = ("guide", "ietf")

#: Where the problem ``type`` URLs point: docs/http.md in the project's repository, one
#: section per error code (``#request_in_progress``).  Pass ``problem_type_base=`` to
#: point them at your own API documentation instead.
PROBLEM_TYPE_BASE = "https://github.com/idempotent-tasks/idempotent-tasks/blob/main/docs/http.md"

#: The statuses ``"ietf"`` changes from the guide's (everything else is the same).
IETF_STATUS_MAP: Mapping[str, int] = {
    ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST.value: 422,
}

#: One short, fixed title per code (RFC 9457: "a short, human-readable summary of the
#: problem type"; the ``detail`` says what happened to this request).
TITLES: Mapping[ErrorCode, str] = {
    ErrorCode.MISSING_KEY: "Idempotency-Key is missing",
    ErrorCode.INVALID_KEY: "Idempotency-Key is invalid",
    ErrorCode.MISSING_TENANT: "The request has no tenant",
    ErrorCode.INVALID_TENANT: "The tenant is invalid",
    ErrorCode.INVALID_OPERATION: "The operation is invalid",
    ErrorCode.INVALID_PAYLOAD: "The request cannot be fingerprinted",
    ErrorCode.RECORD_NOT_FOUND: "No record for this key",
    ErrorCode.KEY_REUSED_WITH_DIFFERENT_REQUEST: "Idempotency-Key reused with another request",
    ErrorCode.REQUEST_IN_PROGRESS: "A request with this Idempotency-Key is in progress",
    ErrorCode.REQUEST_FAILED: "The request with this Idempotency-Key failed",
    ErrorCode.DUPLICATE_REJECTED: "A request with this Idempotency-Key already succeeded",
    ErrorCode.OUTCOME_UNCERTAIN: "The outcome of this Idempotency-Key is uncertain",
    ErrorCode.STORE_UNAVAILABLE: "Idempotency store unavailable",
    ErrorCode.OUTCOME_NOT_RECORDED: "The outcome could not be recorded",
    ErrorCode.RESPONSE_NOT_SERIALIZABLE: "The response cannot be stored",
    ErrorCode.CONFIGURATION_ERROR: "Idempotency is misconfigured",
    ErrorCode.INTERNAL_ERROR: "Internal idempotency error",
}

JSON = b"application/json"
PROBLEM_JSON = b"application/problem+json"


@dataclass(frozen=True, slots=True)
class Profile:
    """A resolved profile: its statuses, whether error responses are kept and replayed,
    and the base of the problem ``type`` URLs (``None``: the guide's JSON bodies)."""

    name: ProfileName
    status_map: Mapping[str, int]
    replay_errors: bool
    problem_type_base: str | None

    def problem_type(self, code: ErrorCode) -> str:
        """The ``type`` URL of ``code``: ``<base>#<code in lower case>``."""
        return f"{self.problem_type_base or PROBLEM_TYPE_BASE}#{code.value.lower()}"

    def error_body(self, err: IdempotencyError, status: int) -> tuple[bytes, bytes]:
        """``(content type, body)`` of the answer to ``err`` under this profile."""
        if self.problem_type_base is None:
            body = {"error": {"code": err.code.value, "message": err.message}}
            return JSON, _dumps(body)
        problem = {
            "type": self.problem_type(err.code),
            "title": TITLES.get(err.code, err.code.value),
            "status": status,
            "detail": err.message,
            "code": err.code.value,
        }
        return PROBLEM_JSON, _dumps(problem)


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def resolve_profile(
    profile: str, *, replay_errors: bool | None, problem_type_base: str | None
) -> Profile:
    """Check the profile options once, at construction."""
    if profile not in PROFILES:
        raise ConfigurationError(f"profile must be one of {PROFILES}, not {profile!r}")
    if problem_type_base is not None and not (
        isinstance(problem_type_base, str) and problem_type_base.strip()
    ):
        raise ConfigurationError("problem_type_base must be a non-empty URL")
    if profile == "ietf":
        return Profile(
            "ietf", IETF_STATUS_MAP, True if replay_errors is None else replay_errors,
            (problem_type_base or PROBLEM_TYPE_BASE).rstrip("#"),
        )
    if problem_type_base is not None:
        raise ConfigurationError('problem_type_base is used by profile="ietf" only')
    return Profile("guide", {}, bool(replay_errors), None)


__all__ = [
    "IETF_STATUS_MAP",
    "PROBLEM_TYPE_BASE",
    "PROFILES",
    "TITLES",
    "Profile",
    "ProfileName",
    "resolve_profile",
]
