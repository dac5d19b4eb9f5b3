"""The one table from an :class:`~idempotent_tasks.Outcome` to an HTTP answer, shared by the
ASGI and WSGI middlewares (docs/guarantees.md, "One outcome, one table"):

=================  ==========================================================================
kind               answer
=================  ==========================================================================
executed           the application's response (stored; this first answer keeps every header)
replayed           the stored response, with ``Idempotent-Replayed: true``
in_progress        409 ``REQUEST_IN_PROGRESS`` + ``Retry-After``
failed             the application's own transient answer (5xx, 408/425/429) as it gave it,
                   or its exception re-raised (the server's 500)
poisoned           409 ``REQUEST_FAILED``, or the error response kept with the record
                   (``replay_errors``) with ``Idempotent-Replayed: true``; when the
                   endpoint ran in this request, its own (permanent) answer
rejected           400 (bad key, tenant or payload), 409 (key reused; 422 under ``"ietf"``),
                   500 (configuration)
store_unavailable  503 + ``Retry-After`` (``OUTCOME_NOT_RECORDED`` included)
=================  ==========================================================================

A route's ``status_map`` overrides the status per error code (on top of the profile's);
``Retry-After`` follows the kind, whatever the status; the body is the profile's (guide JSON
or RFC 9457 problem details).
"""

from __future__ import annotations

from collections.abc import Mapping

from .._core.errors import IdempotencyError, idempotency_error_status
from .._core.outcome import Outcome, refusal_kind
from ._common import CapturedResponse, Headers, UnsuccessfulResponse
from ._profiles import Profile

#: The ``Retry-After`` of the answers that say "come back later" (in progress, store down).
RETRY_AFTER_SECONDS = 1
_RETRY_LATER: frozenset[str] = frozenset({"in_progress", "store_unavailable"})


def library_response(
    outcome: Outcome, status_map: Mapping[str, int], profile: Profile
) -> CapturedResponse | None:
    """The answer the library gives for ``outcome``; ``None`` when the application's own
    response (or exception) is the answer: the endpoint ran in this request and what it did
    was recorded (executed, or a failure the handler counted, released or poisoned)."""
    if outcome.kind == "replayed" or _kept_error(outcome, profile):
        try:
            return CapturedResponse.from_stored(outcome.result)
        except IdempotencyError as err:  # a record that is not an HTTP response
            return error_response(err, status_map, profile, retry_after=False)
    if outcome.kind == "executed" or (outcome.ran and outcome.refusal is None):
        return None
    return error_response(
        outcome.error_object(), status_map, profile,
        retry_after=outcome.kind in _RETRY_LATER,
    )


def _kept_error(outcome: Outcome, profile: Profile) -> bool:
    """A duplicate of a scope poisoned by an error response kept with its record."""
    return (
        outcome.kind == "poisoned" and not outcome.ran and outcome.result is not None
        and profile.replay_errors
    )


def app_exception(outcome: Outcome) -> BaseException | None:
    """The application's own exception, re-raised once the answer is sent (the server then
    logs it and answers 500); ``None`` when the body raised only our response signal."""
    exc = outcome.exception
    if exc is None or isinstance(exc, UnsuccessfulResponse):
        return None
    return exc


def refused(
    err: IdempotencyError, operation: str, tenant: str | None, key: str | None
) -> Outcome:
    """The outcome of a request refused by the middleware before the handler ran (two key
    headers, a tenant or payload the getters refused): nothing ran."""
    return Outcome(
        refusal_kind(err.code, ran=False), error_code=err.code, detail=err.message,
        tenant=tenant, operation=operation, key=key, refusal=err,
    )


def error_response(
    err: IdempotencyError, status_map: Mapping[str, int], profile: Profile, *,
    retry_after: bool,
) -> CapturedResponse:
    """The error every refusal answers with: the guide's ``{"error": {"code", "message"}}``
    or, under ``"ietf"``, RFC 9457 problem details."""
    status = idempotency_error_status(err, status_map)
    content_type, body = profile.error_body(err, status)
    headers: Headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    if retry_after:
        headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode("ascii")))
    return CapturedResponse(status, headers, body)


__all__ = [
    "RETRY_AFTER_SECONDS",
    "app_exception",
    "error_response",
    "library_response",
    "refused",
]
