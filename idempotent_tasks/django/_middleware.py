"""``IdempotencyMiddleware``: ``Idempotency-Key`` for Django views, sync and async.

The HTTP rules are the library's HTTP middlewares' own (``idempotent_tasks.http``: the key
parsing, the classification of responses, the outcome table, the two profiles); this module
only speaks Django.  Per protected request (see :mod:`._views` for which ones):

* key from the ``Idempotency-Key`` header, tenant from ``HTTP["GET_TENANT"](request)`` (the
  Django ``HttpRequest``; ``None`` → 400 ``MISSING_TENANT``), payload from ``GET_PAYLOAD``
  or, by default, method + path + query + SHA-256 of the body;
* the rest of the chain (inner middleware and the view) runs through
  ``handler.run`` / ``handler.run_async`` — at most once per scope; a 2xx response is
  stored and replayed byte for byte (``Idempotent-Replayed: true``), other statuses are
  recorded as failures (4xx permanent, 5xx and 408/425/429 transient, 401/403/407
  released), streaming responses and responses over ``MAX_RESPONSE_BYTES`` are delivered
  once and refused afterwards (they cannot be replayed);
* ``request.idempotency`` is the :class:`~idempotent_tasks.IdempotencyContext` inside the
  view (key, tenant, fencing token…) and carries the outcome's kind afterwards; it is
  ``None`` on requests the middleware does not protect.

Put it after ``AuthenticationMiddleware`` when ``GET_TENANT`` reads ``request.user``.  Any
place in ``MIDDLEWARE`` keeps a replay's security headers: the response's own security headers
(``X-Frame-Options``, ``Content-Security-Policy``, ``Referrer-Policy``…, set by the view or by
middleware inside this one) are stored with it and replayed, and so is ``Vary: Cookie`` when
the view read the session; middleware outside this one runs on replays as on first responses.
``Set-Cookie`` is never stored: a cookie minted for the first request's client (a session, a
CSRF token) is not handed to whoever retries.  A replay runs no view and no ``process_view``
hook (``CsrfViewMiddleware``'s check included): it performs nothing, it only repeats the
answer a request that passed those checks got.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.utils.cache import patch_vary_headers

from .._core.context import current_context
from .._core.errors import ConfigurationError, IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.records import IdempotencyContext
from ..enqueue import begin_enqueue_scope
from ..http._common import (
    KEY_ENVIRON,
    CapturedResponse,
    HTTPRequest,
    Options,
    Policy,
    build_policy,
    classify,
    default_payload,
    failure,
    is_permanent_signal,
)
from ..http._keys import parse_key
from ..http._outcome import app_exception, library_response, refused
from ..http._routes import RouteMatch
from . import _settings
from ._views import Planner


class IdempotencyMiddleware:
    """``MIDDLEWARE += ["idempotent_tasks.django.IdempotencyMiddleware"]`` (after
    ``AuthenticationMiddleware``); configured by ``IDEMPOTENT_TASKS["HTTP"]``.

    ``handler=`` and keyword options (``get_tenant=``, ``routes=``…, the HTTP middlewares'
    names) override the settings when the middleware is built by hand.
    """

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[Any], Any],
        *,
        handler: IdempotencyHandler | None = None,
        **options: Any,
    ) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        handler = handler or _settings.get_handler()
        merged = {**_settings.http_options(), **options}
        self._custom_payload: Callable[[Any], Any] | None = merged.pop("get_payload", None)
        try:
            self.policy = build_policy(handler, Options(**merged))
        except (ConfigurationError, TypeError) as exc:
            message = exc.message if isinstance(exc, ConfigurationError) else str(exc)
            raise ImproperlyConfigured(f"IdempotencyMiddleware: {message}") from exc
        self.planner = Planner(self.policy.routes)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        match = self.planner.plan(request)
        request.idempotency = None
        if match is None:
            return self.get_response(request)
        return _SyncExchange(self, request, match).run()

    async def __acall__(self, request: Any) -> Any:
        match = self.planner.plan(request)
        request.idempotency = None
        if match is None:
            return await self.get_response(request)
        return await _AsyncExchange(self, request, match).run()


def http_request(request: Any, match: RouteMatch) -> HTTPRequest:
    """The framework-neutral view of a Django request (what the default payload hashes)."""
    return HTTPRequest(
        method=str(request.method).upper(),
        path=str(request.path_info),
        query_string=str(request.META.get("QUERY_STRING", "")).encode("latin-1", "replace"),
        headers={str(k).lower(): str(v) for k, v in request.headers.items()},
        body=bytes(request.body),
        operation=match.operation,
        route=match.template,
        path_params=match.path_params,
        environ=request.META,
    )


def captured(response: Any) -> CapturedResponse:
    headers = [(str(k).encode("latin-1"), str(v).encode("latin-1")) for k, v in response.items()]
    return CapturedResponse(
        int(response.status_code), headers, bytes(response.content), response.reason_phrase
    )


def django_response(answer: CapturedResponse) -> HttpResponse:
    """A Django response sending exactly ``answer``'s status, headers and body."""
    response = HttpResponse(answer.body, status=answer.status, reason=answer.reason)
    fields: dict[str, list[str]] = {}
    for name, value in answer.headers:
        fields.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
    for field_name, values in fields.items():
        response.headers[field_name] = ", ".join(values)
    return response


class _Exchange:
    """One protected request; the sync and async twins differ only in how they call."""

    def __init__(self, middleware: IdempotencyMiddleware, request: Any, match: RouteMatch):
        self.middleware = middleware
        self.policy: Policy = middleware.policy
        self.request = request
        self.match = match
        self.response: Any = None
        self.unkeyed: IdempotencyContext | None = None

    def key(self) -> str | None:
        raw = self.request.META.get(KEY_ENVIRON)  # Django joins repeated fields with ","
        return parse_key([] if raw is None else [str(raw)])

    def default_payload(self) -> Any:
        return default_payload(http_request(self.request, self.match))

    def start_unkeyed(self) -> None:
        self.unkeyed = IdempotencyContext(
            tenant=None, operation=self.match.operation, key=None, request_hash=None,
            outcome="unkeyed",
        )
        self.request.idempotency = self.unkeyed

    def enter_body(self) -> None:
        ctx = current_context()
        if ctx is not None:
            self.request.idempotency = ctx
            begin_enqueue_scope(ctx)

    def finish(self, response: Any) -> dict[str, Any]:
        """The value to store (a 2xx), or raise the failure the handler must record."""
        self.response = response
        status, settings = int(response.status_code), self.match.settings
        if response.streaming:
            raise failure(status, settings, None, sent=False, reason="streaming_response")
        if len(response.content) > self.policy.max_response_bytes:
            ok = 200 <= status < 300
            raise failure(status, settings, None, sent=False,
                          reason="response_too_large" if ok else "unsuccessful_status")
        if _read_the_session(self.request):
            patch_vary_headers(response, ("Cookie",))
        answer = captured(response)
        failed = classify(answer, settings, self.policy)
        if failed is not None:
            raise failed
        return answer.to_stored(self.policy.replay_headers)

    def answer(self, outcome: Outcome) -> Any:
        """What the outcome table says; the view's own response when it ran and was
        recorded; the view's exception re-raised."""
        ctx = self.unkeyed or outcome.context
        ctx.outcome = outcome.kind
        self.request.idempotency = ctx
        response = library_response(outcome, self.match.settings.status_map, self.policy.profile)
        if response is not None:
            return django_response(response)
        error = app_exception(outcome)
        if error is not None:
            raise error
        return outcome.result if self.unkeyed is not None else self.response

    def refused(self, err: IdempotencyError, tenant: str | None, key: str | None) -> Outcome:
        return refused(err, self.match.operation, tenant, key)


class _SyncExchange(_Exchange):
    def run(self) -> Any:
        return self.answer(self._outcome())

    def _outcome(self) -> Outcome:
        settings, key = self.match.settings, None
        tenant: str | None = None
        handler = self.policy.handler
        try:
            key = self.key()
            if key is None and not settings.require_key:
                self.start_unkeyed()
                return handler.run(
                    lambda: self.middleware.get_response(self.request),
                    operation=self.match.operation, tenant=None, key=None, require_key=False,
                )
            got = self.policy.get_tenant(self.request)
            if not (got is None or isinstance(got, str)):
                raise TypeError("GET_TENANT must return str | None (a sync middleware)")
            tenant = got
            custom = self.middleware._custom_payload
            payload = custom(self.request) if custom is not None else self.default_payload()
        except IdempotencyError as err:
            return self.refused(err, tenant, key)
        return handler.run(
            self._body, operation=self.match.operation, tenant=tenant, key=key,
            payload=payload, permanent=is_permanent_signal, require_key=settings.require_key,
            **settings.policies,
        )

    def _body(self) -> dict[str, Any]:
        self.enter_body()
        return self.finish(self.middleware.get_response(self.request))


class _AsyncExchange(_Exchange):
    async def run(self) -> Any:
        return self.answer(await self._outcome())

    async def _outcome(self) -> Outcome:
        settings, key, tenant = self.match.settings, None, None
        handler = self.policy.handler
        try:
            key = self.key()
            if key is None and not settings.require_key:
                self.start_unkeyed()
                return await handler.run_async(
                    lambda: self.middleware.get_response(self.request),
                    operation=self.match.operation, tenant=None, key=None, require_key=False,
                )
            tenant = await _call(self.policy.get_tenant, self.request)
            custom = self.middleware._custom_payload
            payload = (
                await _call(custom, self.request) if custom is not None
                else self.default_payload()
            )
        except IdempotencyError as err:
            return self.refused(err, tenant, key)
        return await handler.run_async(
            self._body, operation=self.match.operation, tenant=tenant, key=key,
            payload=payload, permanent=is_permanent_signal, require_key=settings.require_key,
            **settings.policies,
        )

    async def _body(self) -> dict[str, Any]:
        self.enter_body()
        return self.finish(await self.middleware.get_response(self.request))


def _read_the_session(request: Any) -> bool:
    """Whether this response depends on the session cookie.

    ``SessionMiddleware`` adds ``Vary: Cookie`` on the way out when the request read the
    session; outside this middleware it does so after the response was stored, and a replay
    (no view, so no session read) would go out without it.  Adding it here stores it."""
    session = getattr(request, "session", None)
    return bool(getattr(session, "accessed", False))


async def _call(fn: Callable[[Any], Any], request: Any) -> Any:
    """A getter on the event loop: awaited when async, else in Django's sync thread (it may
    read ``request.user``, which queries the database)."""
    if iscoroutinefunction(fn):
        return await fn(request)
    return await sync_to_async(fn)(request)


__all__ = ["IdempotencyMiddleware", "captured", "django_response", "http_request"]
