"""HTTP middleware: ``Idempotency-Key`` for ASGI (Starlette, FastAPI) and WSGI (Flask, Django)
applications, on the same :class:`~idempotent_tasks.IdempotencyHandler` as tasks and consumers.

* Which requests: the ``routes`` given (templates such as ``"/payments/{id}"`` or
  ``("POST", "/payments/{id}")``), default every POST, PUT, PATCH and DELETE.  GET, HEAD,
  OPTIONS and unlisted routes pass through untouched.
* Scope: tenant from ``get_tenant(request)`` (required; ``None`` → 400 ``MISSING_TENANT``),
  operation ``"METHOD /template"``, key from the ``Idempotency-Key`` header: an RFC 8941
  string (``"8e03…"``) or the bare value (``8e03…``), the same key either way; lists,
  parameters, stray quotes and two fields are ``INVALID_KEY``.
* Payload: ``get_payload(request)``, default method + path + query + SHA-256 of the body.
* Outcome: only 2xx responses are stored and replayed (byte for byte, with
  ``Idempotent-Replayed: true``); 401/403/407 release the key uncounted; other statuses are
  recorded as failures — 4xx permanent (poisoned; 408/425/429 excepted), 5xx transient
  (released and counted) — unless ``permanent=`` says otherwise.  With ``replay_errors``
  a permanent error response is kept with the record and replayed like a success.
* Profiles: ``profile="guide"`` (default: the production guide's statuses, JSON errors
  ``{"error": {"code", "message"}}``) or ``profile="ietf"`` (the IETF draft's 400 / 422 /
  409, RFC 9457 ``application/problem+json`` errors, ``replay_errors=True``).
  ``status_map`` overrides single codes on top of either.
* Every other outcome (in progress, poisoned, rejected, store unavailable) is answered by one
  table shared with every integration (``Retry-After`` on 409 in progress and on 503).
* Tasks: :func:`~idempotent_tasks.enqueue.enqueue_once` (re-exported here) enqueues a Celery
  task / Dramatiq message with a key derived from the request's scope, so a retried request
  never makes a task run twice.

See ``docs/http.md``.
"""

from __future__ import annotations

from ..enqueue import derive_task_key, enqueue_once  # re-exported: old imports keep working
from ._asgi import ASGIIdempotencyMiddleware
from ._common import (
    DEFAULT_REPLAY_HEADERS,
    KEY_HEADER,
    RELEASED_STATUSES,
    HTTPRequest,
    default_payload,
)
from ._keys import parse_key
from ._profiles import PROBLEM_TYPE_BASE, PROFILES
from ._routes import (
    RETRYABLE_CLIENT_STATUSES,
    UNSAFE_METHODS,
    Route,
    default_permanent,
)
from ._wsgi import WSGIIdempotencyMiddleware

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "KEY_HEADER",
    "PROBLEM_TYPE_BASE",
    "PROFILES",
    "RELEASED_STATUSES",
    "RETRYABLE_CLIENT_STATUSES",
    "UNSAFE_METHODS",
    "ASGIIdempotencyMiddleware",
    "HTTPRequest",
    "Route",
    "WSGIIdempotencyMiddleware",
    "default_payload",
    "default_permanent",
    "derive_task_key",
    "enqueue_once",
    "parse_key",
]
