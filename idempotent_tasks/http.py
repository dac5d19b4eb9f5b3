"""HTTP middleware: ``Idempotency-Key`` for ASGI (Starlette, FastAPI) and WSGI (Flask, Django)
applications, on the same :class:`~idempotent_tasks.IdempotencyHandler` as tasks and consumers.

* Which requests: the ``routes`` given (templates such as ``"/payments/{id}"`` or
  ``("POST", "/payments/{id}")``), default every POST, PUT, PATCH and DELETE.  GET, HEAD,
  OPTIONS and unlisted routes pass through untouched.
* Scope: tenant from ``get_tenant(request)`` (required; ``None`` → 400 ``MISSING_TENANT``),
  operation ``"METHOD /template"``, key from the ``Idempotency-Key`` header.
* Payload: ``get_payload(request)``, default method + path + query + SHA-256 of the body.
* Outcome: only 2xx responses are stored and replayed (byte for byte, with
  ``Idempotent-Replayed: true``); other statuses are recorded as failures — 4xx permanent
  (poisoned; 408/425/429 excepted), 5xx transient (released and counted) — unless
  ``permanent=`` says otherwise.  Refusals answer ``{"error": {"code", "message"}}`` with the
  status of :func:`~idempotent_tasks.idempotency_error_status` and ``status_map``.
* Tasks: :func:`enqueue_once` enqueues a Celery task / Dramatiq message with a key derived
  from the request's scope, so a retried request never makes a task run twice.

See ``docs/http.md``.
"""

from __future__ import annotations

from ._http._asgi import ASGIIdempotencyMiddleware
from ._http._common import (
    DEFAULT_REPLAY_HEADERS,
    KEY_HEADER,
    HTTPRequest,
    default_payload,
)
from ._http._enqueue import derive_task_key, enqueue_once
from ._http._routes import (
    RETRYABLE_CLIENT_STATUSES,
    UNSAFE_METHODS,
    Route,
    default_permanent,
)
from ._http._wsgi import WSGIIdempotencyMiddleware

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "KEY_HEADER",
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
]
