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
superseded         409 ``REQUEST_IN_PROGRESS`` + ``Retry-After``: the endpoint ran past its
                   lease and a newer attempt owns the scope; its own answer is not sent
=================  ==========================================================================

The message of a ``STORE_UNAVAILABLE``, ``OUTCOME_NOT_RECORDED``, ``INTERNAL_ERROR`` or
``CONFIGURATION_ERROR`` answer can carry the inside (a driver's text: internal hosts, ports):
clients get a generic sentence with a correlation id, and the full message goes to the log line
that carries the same id.

A route's ``status_map`` overrides the status per error code (on top of the profile's);
``Retry-After`` follows the kind, whatever the status; the body is the profile's (guide JSON
or RFC 9457 problem details).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from .._core.errors import ErrorCode, IdempotencyError, idempotency_error_status, make_error
from .._core.logging import Logger, default_logger
from .._core.outcome import Outcome
from ._common import CapturedResponse, Headers, UnsuccessfulResponse
from ._profiles import Profile

#: The ``Retry-After`` of the answers that say "come back later" (in progress, store down).
RETRY_AFTER_SECONDS = 1
_RETRY_LATER: frozenset[str] = frozenset({"in_progress", "store_unavailable", "superseded"})


#: The codes whose message may carry the inside, and what clients are told instead.
_WITHHELD: dict[ErrorCode, str] = {
    ErrorCode.STORE_UNAVAILABLE: "the idempotency store is unavailable; retry later",
    ErrorCode.OUTCOME_NOT_RECORDED: (
        "the request ran but its outcome could not be recorded; retry later"
    ),
    ErrorCode.INTERNAL_ERROR: "an internal error occurred",
    ErrorCode.CONFIGURATION_ERROR: "the idempotency layer is misconfigured",
}


def library_response(
    outcome: Outcome, status_map: Mapping[str, int], profile: Profile,
    logger: Logger | None = None,
) -> CapturedResponse | None:
    """The answer the library gives for ``outcome``; ``None`` when the application's own
    response (or exception) is the answer: the endpoint ran in this request and what it did
    was recorded (executed, or a failure the handler counted, released or poisoned).
    ``logger`` gets the full message of a withheld error (default: the library's logger)."""
    if outcome.kind == "replayed" or _kept_error(outcome, profile):
        try:
            return CapturedResponse.from_stored(outcome.result)
        except IdempotencyError as err:  # a record that is not an HTTP response
            withheld = public_error(err, logger)
            return error_response(withheld, status_map, profile, retry_after=False)
    if outcome.kind == "executed" or (
        outcome.ran and outcome.refusal is None and outcome.kind != "superseded"
    ):
        return None
    return error_response(
        public_error(outcome.error_object(), logger), status_map, profile,
        retry_after=outcome.kind in _RETRY_LATER,
    )


def public_error(err: IdempotencyError, logger: Logger | None = None) -> IdempotencyError:
    """``err`` as a client may see it: for a code whose message may name the inside, a
    generic sentence with a correlation id (the full message is logged with that id)."""
    generic = _WITHHELD.get(err.code)
    if generic is None:
        return err
    reference = uuid.uuid4().hex[:16]
    (logger or default_logger()).error(
        "http_error_detail_withheld", correlation_id=reference, error_code=err.code.value,
        error=err.message, tenant=err.tenant, operation=err.operation, key=err.key,
    )
    return make_error(
        err.code, f"{generic} (correlation id {reference})",
        tenant=err.tenant, operation=err.operation, key=err.key,
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
    return Outcome.refused(err, operation=operation, tenant=tenant, key=key)


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
    "public_error",
    "refused",
]
