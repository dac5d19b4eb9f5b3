"""What the ASGI and WSGI middlewares share: the request view, the stored response format,
classification of responses, error bodies and the per-request context.

The stored result of a protected request is a JSON object::

    {"v": 1, "status": 201, "reason": null,
     "headers": [["content-type", "application/json"], ...],   # latin-1 text: byte-exact
     "body": "<base64 of the body bytes>"}

Headers are decoded as latin-1 (a bijection on bytes), and the body as base64, so a replay
sends exactly the bytes the application produced.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._core import keys
from .._core.errors import ConfigurationError, ErrorCode, IdempotencyError, InvalidInputError
from .._core.handler import IdempotencyHandler
from .._core.policies import given_policies
from .._core.signals import Poison, Release
from ..typing import OnFailure, OnInProgress, OnSuccess, Seconds
from ._profiles import Profile, resolve_profile
from ._routes import RouteSettings, RouteSpec, RouteTable, StatusPolicy, as_predicate

#: The header clients send their key in (matched case-insensitively); the one spelling
#: both middlewares derive their look-ups from.
KEY_HEADER = keys.KEY_HEADER
#: ``KEY_HEADER`` as an ASGI header name and as a WSGI environ key (PEP 3333: ``HTTP_*``).
KEY_HEADER_BYTES = KEY_HEADER.encode("latin-1")
KEY_ENVIRON = "HTTP_" + KEY_HEADER.upper().replace("-", "_")
#: Added to every replayed response.
REPLAYED_HEADER = (b"idempotent-replayed", b"true")

#: Security headers a response carries about itself (framing, sniffing, referrer, isolation,
#: transport and content policies).  They are the same for every client of the response, so
#: they are stored and replayed: a replay never goes out with less protection than the first
#: response had, whichever middleware set them and wherever it sits in the stack.
SECURITY_HEADERS: frozenset[str] = frozenset(
    {
        "x-frame-options",
        "x-content-type-options",
        "x-xss-protection",
        "referrer-policy",
        "strict-transport-security",
        "content-security-policy",
        "content-security-policy-report-only",
        "permissions-policy",
        "cross-origin-opener-policy",
        "cross-origin-embedder-policy",
        "cross-origin-resource-policy",
    }
)

#: Response headers stored with a success and sent again on replays: those that describe the
#: content or the created resource, and the :data:`SECURITY_HEADERS`.  Left out on purpose:
#: ``date`` and ``server`` (they describe this transmission, the server adds fresh ones),
#: ``set-cookie`` (a session or CSRF credential minted for the first request's client must
#: never be handed to whoever retries), hop-by-hop headers (``connection``,
#: ``transfer-encoding``) and per-request ids (``x-request-id``).
DEFAULT_REPLAY_HEADERS: frozenset[str] = SECURITY_HEADERS | frozenset(
    {
        "content-type",
        "content-length",
        "content-language",
        "content-encoding",
        "content-location",
        "content-disposition",
        "location",
        "etag",
        "last-modified",
        "cache-control",
        "expires",
        "vary",
        "link",
    }
)

#: Room kept in the handler's ``max_response_bytes`` for the stored headers and JSON framing.
_STORED_OVERHEAD = 16 * 1024

TenantGetter = Callable[["HTTPRequest"], "str | Awaitable[str | None] | None"]
PayloadGetter = Callable[["HTTPRequest"], Any]
Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class HTTPRequest:
    """The framework-neutral view of a protected request given to ``get_tenant`` and
    ``get_payload``.

    ``headers`` has lower-case names (repeated headers joined with ``", "``); ``body`` is the
    complete request body (already read, and fed again to the application).  ``scope`` is
    the ASGI scope (``None`` under WSGI), ``environ`` the WSGI environ (``None`` under ASGI):
    reach for them to read what an authentication layer outside this middleware attached
    (``scope["user"]``, ``environ["REMOTE_USER"]``…).
    """

    method: str
    path: str
    query_string: bytes
    headers: Mapping[str, str]
    body: bytes
    operation: str
    route: str
    path_params: dict[str, str]
    scope: dict[str, Any] | None = None
    environ: dict[str, Any] | None = None

    def json(self) -> Any:
        """The body parsed as JSON; a body that is not JSON is a 400 ``INVALID_PAYLOAD``."""
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInputError(
                "the request body is not valid JSON", code=ErrorCode.INVALID_PAYLOAD
            ) from exc


def default_payload(request: HTTPRequest) -> dict[str, str]:
    """What defines the operation by default: method, path, query string and body.

    The body is represented by its SHA-256 (hex), which is JSON-safe whatever the bytes and
    keeps the hashed payload small however big the body is.
    """
    return {
        "method": request.method,
        "path": request.path,
        "query": request.query_string.decode("latin-1"),
        "body_sha256": hashlib.sha256(request.body).hexdigest(),
    }


@dataclass(slots=True)
class CapturedResponse:
    """A complete response: what the application sent, or what a replay sends."""

    status: int
    headers: Headers
    body: bytes
    reason: str | None = None  # WSGI keeps the application's reason phrase

    def to_stored(self, replay_headers: frozenset[str]) -> dict[str, Any]:
        kept = [
            [k.decode("latin-1"), v.decode("latin-1")]
            for k, v in self.headers
            if k.decode("latin-1").lower() in replay_headers
        ]
        return {
            "v": 1,
            "status": self.status,
            "reason": self.reason,
            "headers": kept,
            "body": base64.b64encode(self.body).decode("ascii"),
        }

    @classmethod
    def from_stored(cls, value: Any) -> CapturedResponse:
        """Rebuild a stored success; anything else in the record is an internal error."""
        try:
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in value["headers"]]
            return cls(
                status=int(value["status"]),
                headers=[*headers, REPLAYED_HEADER],
                body=base64.b64decode(value["body"], validate=True),
                reason=value.get("reason"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IdempotencyError(
                "the stored response is not an HTTP response", code=ErrorCode.INTERNAL_ERROR
            ) from exc


#: Statuses that say "you may not" (authentication, authorization, proxy authentication,
#: CSRF) rather than "this operation failed": the key is released, nothing is counted.
RELEASED_STATUSES: frozenset[int] = frozenset({401, 403, 407})


class UnsuccessfulResponse(Exception):
    """Raised *inside* the body so that the handler records a failure, not a success.

    ``permanent`` makes the handler poison the scope; otherwise it counts a transient
    failure and releases it.  ``sent`` means the response already went to the client
    (a response too large to buffer was streamed through).
    """

    def __init__(self, response: CapturedResponse | None, *, permanent: bool, sent: bool,
                 reason: str) -> None:
        Exception.__init__(self, reason)  # not super(): the signal subclasses mix in more
        self.response = response
        self.permanent = permanent
        self.sent = sent
        self.reason = reason


class KeptResponse(UnsuccessfulResponse, Poison):
    """A permanent error response kept with the FAILED record (``replay_errors``): every
    retry gets these bytes again instead of ``409 REQUEST_FAILED``."""

    def __init__(self, response: CapturedResponse, stored: dict[str, Any]) -> None:
        super().__init__(response, permanent=True, sent=False, reason="permanent_status_kept")
        self.value = stored


class ReleasedResponse(UnsuccessfulResponse, Release):
    """A 401/403/407: not the operation's outcome, so the key is released uncounted."""

    counted = False

    def __init__(self, response: CapturedResponse | None, *, sent: bool) -> None:
        super().__init__(response, permanent=False, sent=sent, reason="not_allowed")


def is_permanent_signal(exc: BaseException) -> bool:
    """The handler's ``permanent=`` predicate: only our classified responses poison; an
    exception raised by the application is transient (it is a 500 in any framework)."""
    return isinstance(exc, UnsuccessfulResponse) and exc.permanent


def failure(
    status: int, settings: RouteSettings, response: CapturedResponse | None, *, sent: bool,
    reason: str,
) -> UnsuccessfulResponse:
    """The failure a non-2xx answer (or a response that cannot be stored) records."""
    if status in RELEASED_STATUSES:
        return ReleasedResponse(response, sent=sent)
    permanent = 200 <= status < 300 or settings.permanent(status)
    return UnsuccessfulResponse(response, permanent=permanent, sent=sent, reason=reason)


def classify(
    response: CapturedResponse, settings: RouteSettings, policy: Policy
) -> UnsuccessfulResponse | None:
    """``None`` for a 2xx (store it); otherwise the failure the handler must record: a
    released 401/403/407, a kept permanent error (``replay_errors``), or a plain one."""
    status = response.status
    if 200 <= status < 300:
        return None
    if (
        policy.profile.replay_errors and status not in RELEASED_STATUSES
        and settings.permanent(status)
    ):
        return KeptResponse(response, response.to_stored(policy.replay_headers))
    reason = "permanent_status" if settings.permanent(status) else "transient_status"
    return failure(status, settings, response, sent=False, reason=reason)


@dataclass(frozen=True, slots=True)
class Policy:
    """Validated middleware options, shared by the ASGI and WSGI twins."""

    handler: IdempotencyHandler
    get_tenant: TenantGetter
    get_payload: PayloadGetter
    routes: RouteTable
    max_response_bytes: int
    replay_headers: frozenset[str]
    profile: Profile

    def payload(self, request: HTTPRequest) -> Any:
        return self.get_payload(request)


@dataclass(frozen=True, slots=True)
class Options:
    """The keyword options both middlewares take (checked once by :func:`build_policy`)."""

    get_tenant: TenantGetter | None = None
    get_payload: PayloadGetter | None = None
    require_key: bool = True
    status_map: Mapping[str, int] | None = None
    routes: Iterable[RouteSpec] | None = None
    permanent: StatusPolicy | None = None
    max_response_bytes: int | None = None
    replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS
    profile: str = "guide"
    replay_errors: bool | None = None
    problem_type_base: str | None = None
    on_in_progress: OnInProgress | None = None
    wait_timeout: Seconds | None = None
    on_success: OnSuccess | None = None
    reuse_after: Seconds | None = None
    on_failure: OnFailure | None = None


def build_policy(handler: IdempotencyHandler, options: Options) -> Policy:
    """Check the options once, at construction (never at the first request)."""
    o = options
    if o.get_tenant is None or not callable(o.get_tenant):
        raise ConfigurationError(
            "get_tenant is required: a callable returning the authenticated tenant of a "
            "request (there is no shared 'anonymous' default)"
        )
    if not isinstance(handler, IdempotencyHandler):
        raise ConfigurationError("handler must be an IdempotencyHandler")
    storable = (handler.max_response_bytes - _STORED_OVERHEAD) * 3 // 4
    if storable <= 0:
        raise ConfigurationError("handler.max_response_bytes is too small to store responses")
    limit = storable if o.max_response_bytes is None else min(o.max_response_bytes, storable)
    profile = resolve_profile(
        o.profile, replay_errors=o.replay_errors, problem_type_base=o.problem_type_base
    )
    statuses = {**profile.status_map, **dict(o.status_map or {})}
    defaults = RouteSettings(
        o.require_key, statuses, as_predicate(o.permanent), given_policies(o)
    )
    routes = RouteTable(o.routes, defaults)
    for settings in routes.all_settings():  # a bad policy fails here, not on a request
        handler.defaults.merged(**settings.policies)
    return Policy(
        handler=handler,
        get_tenant=o.get_tenant,
        get_payload=o.get_payload or default_payload,
        routes=routes,
        max_response_bytes=limit,
        replay_headers=frozenset(h.lower() for h in o.replay_headers),
        profile=profile,
    )


async def resolve_tenant(policy: Policy, request: HTTPRequest) -> str | None:
    """``get_tenant`` may be sync or async under ASGI."""
    tenant = policy.get_tenant(request)
    if inspect.isawaitable(tenant):
        resolved: str | None = await tenant
        return resolved
    return tenant


__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "KEY_ENVIRON",
    "KEY_HEADER",
    "KEY_HEADER_BYTES",
    "RELEASED_STATUSES",
    "REPLAYED_HEADER",
    "SECURITY_HEADERS",
    "CapturedResponse",
    "HTTPRequest",
    "KeptResponse",
    "Options",
    "Policy",
    "ReleasedResponse",
    "UnsuccessfulResponse",
    "build_policy",
    "classify",
    "default_payload",
    "failure",
    "is_permanent_signal",
    "resolve_tenant",
]
