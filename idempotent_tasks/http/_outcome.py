"""The one table from an :class:`~idempotent_tasks.Outcome` to an HTTP answer, shared by the
ASGI, WSGI and Django middlewares (docs/http.md, "The outcome table").

Who answers is a function of the outcome's ``kind`` alone, except for ``poisoned``
(:func:`table_row`): the endpoint (its own response, or its exception re-raised), the
response stored with the record (a replay, or an error response kept with ``replay_errors``),
or the library (an error whose status follows the error code, the profile and the route's
``status_map``; whose body is the profile's: guide JSON or RFC 9457 problem details; with
``Retry-After`` for the kinds that say "come back later": ``in_progress``, ``superseded``,
``store_unavailable``).

The message of a ``STORE_UNAVAILABLE``, ``OUTCOME_NOT_RECORDED``, ``INTERNAL_ERROR`` or
``CONFIGURATION_ERROR`` answer can carry the inside (a driver's text: internal hosts, ports):
clients get a generic sentence with a correlation id, and the full message goes to the log line
that carries the same id.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from .._core.errors import ErrorCode, IdempotencyError, idempotency_error_status, make_error
from .._core.logging import Logger, default_logger
from .._core.outcome import Outcome
from ._common import CapturedResponse, Headers, UnsuccessfulResponse
from ._profiles import Profile

#: The ``Retry-After`` of the answers that say "come back later" (in progress, store down).
RETRY_AFTER_SECONDS = 1


class Row(NamedTuple):
    """One row of the outcome table: who answers, and whether the library's answer carries
    ``Retry-After`` (its status and body follow the error code and the profile)."""

    by: Literal["endpoint", "stored", "library"]
    retry_after: bool = False


ENDPOINT = Row("endpoint")
STORED = Row("stored")
LIBRARY = Row("library")
LATER = Row("library", retry_after=True)

#: Every kind but ``poisoned``: its answer is its kind's alone.
BY_KIND: dict[str, Row] = {
    "executed": ENDPOINT,  # the endpoint's 2xx, stored before it is sent
    "replayed": STORED,  # plus Idempotent-Replayed: true
    "failed": ENDPOINT,  # its transient status or its exception, as it gave it
    "in_progress": LATER,
    "superseded": LATER,  # it ran past its lease: its own answer is fenced off
    "store_unavailable": LATER,
    "rejected": LIBRARY,
}


def table_row(
    kind: str, error_code: ErrorCode | None, profile: Profile, stored: Any, endpoint_failed: bool
) -> Row:
    """Who answers an outcome of ``kind``.  Only ``poisoned`` needs more than its kind: with
    ``REQUEST_FAILED`` it is the endpoint's own permanent answer when the endpoint failed in
    this request (``endpoint_failed``: its failure is what the outcome carries), a later
    request's replay of the response kept with the record (``stored``) when the profile
    replays errors, else the library's 409; any other code (a record that cannot be read,
    a result that cannot be stored) is the library's 500."""
    if kind != "poisoned":
        return BY_KIND[kind]
    # A poisoned scope answers this request with the endpoint's own 4xx and every later one
    # with 409 or the kept response: the kind and code are the same, only whether the
    # endpoint's failure came with the outcome tells them apart.
    if error_code not in (ErrorCode.REQUEST_FAILED, None):
        return LIBRARY
    if endpoint_failed:
        return ENDPOINT
    if stored is not None and profile.replay_errors:
        return STORED
    return LIBRARY


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
    """The answer the library gives for ``outcome`` (:func:`table_row`); ``None`` when the
    endpoint's own response (or exception) is the answer.  ``logger`` gets the full message
    of a withheld error (default: the library's logger)."""
    row = table_row(outcome.kind, outcome.error_code, profile, outcome.result,
                    outcome.exception is not None)
    if row.by == "endpoint":
        return None
    if row.by == "stored":
        try:
            return CapturedResponse.from_stored(outcome.result)
        except IdempotencyError as err:  # a record that is not an HTTP response
            withheld = public_error(err, logger)
            return error_response(withheld, status_map, profile, retry_after=False)
    return error_response(
        public_error(outcome.error_object(), logger), status_map, profile,
        retry_after=row.retry_after,
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
    "BY_KIND",
    "ENDPOINT",
    "LATER",
    "LIBRARY",
    "RETRY_AFTER_SECONDS",
    "STORED",
    "Row",
    "app_exception",
    "error_response",
    "library_response",
    "public_error",
    "refused",
    "table_row",
]
