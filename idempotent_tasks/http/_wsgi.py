"""WSGI middleware: Flask, Django or any PEP 3333 application.

The twin of the ASGI middleware on :meth:`IdempotencyHandler.run`: the request body is
read fully (it is hashed) and put back as ``wsgi.input``; the application's status, headers
and body are captured before anything is sent.  WSGI cannot stream to the client while the
handler is still deciding, so a response bigger than ``max_response_bytes`` is spooled to a
temporary file instead of memory, sent in full, and the scope is recorded as FAILED because
such a response can never be replayed (a retry gets ``409 REQUEST_FAILED``).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import IO, Any

from .._core.context import current_context
from .._core.errors import IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.records import IdempotencyContext
from ..enqueue import begin_enqueue_scope
from ..typing import OnFailure, OnInProgress, OnSuccess, Seconds
from ._common import (
    DEFAULT_REPLAY_HEADERS,
    KEY_ENVIRON,
    CapturedResponse,
    HTTPRequest,
    Options,
    PayloadGetter,
    Policy,
    TenantGetter,
    build_policy,
    classify,
    failure,
    is_permanent_signal,
)
from ._keys import parse_key
from ._outcome import app_exception, library_response, refused
from ._profiles import ProfileName
from ._routes import RouteMatch, RouteSpec, StatusPolicy

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
_BLOCK = 64 * 1024


class WSGIIdempotencyMiddleware:
    """Idempotency-Key support for a WSGI application (see ``docs/http.md``).

    Flask: ``app.wsgi_app = WSGIIdempotencyMiddleware(app.wsgi_app, handler, get_tenant=...)``.
    """

    def __init__(
        self,
        app: WSGIApp,
        handler: IdempotencyHandler,
        *,
        get_tenant: TenantGetter | None = None,
        get_payload: PayloadGetter | None = None,
        require_key: bool = True,
        status_map: Mapping[str, int] | None = None,
        routes: Iterable[RouteSpec] | None = None,
        permanent: StatusPolicy | None = None,
        max_response_bytes: int | None = None,
        replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
        profile: ProfileName = "guide",
        replay_errors: bool | None = None,
        problem_type_base: str | None = None,
        on_in_progress: OnInProgress | None = None,
        wait_timeout: Seconds | None = None,
        on_success: OnSuccess | None = None,
        reuse_after: Seconds | None = None,
        on_failure: OnFailure | None = None,
    ) -> None:
        self.app = app
        self.policy = build_policy(handler, Options(
            get_tenant=get_tenant, get_payload=get_payload, require_key=require_key,
            status_map=status_map, routes=routes, permanent=permanent,
            max_response_bytes=max_response_bytes, replay_headers=replay_headers,
            profile=profile, replay_errors=replay_errors, problem_type_base=problem_type_base,
            on_in_progress=on_in_progress, wait_timeout=wait_timeout, on_success=on_success,
            reuse_after=reuse_after, on_failure=on_failure,
        ))

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET"))
        path = _path(environ)
        match = self.policy.routes.match(method, path)
        if match is None:
            return self.app(environ, start_response)
        body = _read_body(environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        request = _request(environ, method, path, match, body)
        return _Exchange(self.app, self.policy, environ, match, request).run(start_response)


def _path(environ: Environ) -> str:
    """PEP 3333 carries the path as latin-1-decoded bytes; the routes are text."""
    raw = str(environ.get("PATH_INFO", "") or "/")
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def _read_body(environ: Environ) -> bytes:
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > 0:
        data: bytes = stream.read(length)
        return data
    if environ.get("wsgi.input_terminated"):  # chunked request bodies
        rest: bytes = stream.read()
        return rest
    return b""


def _request(environ: Environ, method: str, path: str, match: RouteMatch,
             body: bytes) -> HTTPRequest:
    headers: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers[name[5:].replace("_", "-").lower()] = str(value)
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers[name.replace("_", "-").lower()] = str(value)
    return HTTPRequest(
        method=method.upper(), path=path,
        query_string=str(environ.get("QUERY_STRING", "")).encode("latin-1", "replace"),
        headers=headers, body=body, operation=match.operation, route=match.template,
        path_params=match.path_params, environ=environ,
    )


class _Capture:
    """``start_response`` and body sink for the application; spools past ``limit``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.status_line: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=limit)  # noqa: SIM115
        self.size = 0

    def start_response(self, status: str, headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Callable[[bytes], object]:
        # Nothing has been sent yet, so a later call (with exc_info) may always replace it.
        self.status_line = status
        self.headers = list(headers)
        return self.write

    def write(self, data: bytes) -> None:
        self.spool.write(data)
        self.size += len(data)

    def run(self, app: WSGIApp, environ: Environ) -> None:
        result = app(environ, self.start_response)
        try:
            for chunk in result:
                if chunk:
                    self.write(chunk)
        finally:
            close = getattr(result, "close", None)
            if callable(close):
                close()

    @property
    def status(self) -> int:
        assert self.status_line is not None
        return int(self.status_line.split(" ", 1)[0])

    def response(self) -> CapturedResponse:
        assert self.status_line is not None
        self.spool.seek(0)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]
        reason = self.status_line.partition(" ")[2]
        return CapturedResponse(self.status, headers, self.spool.read(), reason)

    def finish(self, match: RouteMatch, policy: Policy) -> dict[str, Any]:
        """The value to store (a 2xx), or raise the failure the handler must record."""
        if self.status_line is None:
            raise RuntimeError("the application did not call start_response")
        if self.size > self._limit:
            ok = 200 <= self.status < 300
            raise failure(self.status, match.settings, None, sent=False,
                          reason="response_too_large" if ok else "unsuccessful_status")
        response = self.response()
        failed = classify(response, match.settings, policy)
        if failed is not None:
            raise failed
        return response.to_stored(policy.replay_headers)

    def iter_body(self) -> Iterator[bytes]:
        """The captured body in blocks (it may be on disk), closing the spool at the end."""
        try:
            self.spool.seek(0)
            while block := self.spool.read(_BLOCK):
                yield block
        finally:
            self.spool.close()


def _status_line(response: CapturedResponse) -> str:
    reason = response.reason
    if not reason:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:
            reason = "Unknown"
    return f"{response.status} {reason}"


def _send(start_response: StartResponse, response: CapturedResponse) -> list[bytes]:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
    start_response(_status_line(response), headers)
    return [response.body]


class _Exchange:
    """One protected request: resolve key, tenant and payload, run, answer the outcome."""

    def __init__(self, app: WSGIApp, policy: Policy, environ: Environ, match: RouteMatch,
                 request: HTTPRequest) -> None:
        self.app = app
        self.policy = policy
        self.environ = environ
        self.match = match
        self.request = request
        self.capture = _Capture(policy.max_response_bytes)
        self.unkeyed: IdempotencyContext | None = None

    def run(self, start_response: StartResponse) -> Iterable[bytes]:
        return self._answer(self._outcome(start_response), start_response)

    def _outcome(self, start_response: StartResponse) -> Outcome:
        """What happened: the handler's outcome, or the refusal of a bad key, tenant or
        payload found before it ran.  Other exceptions (a getter's bug) propagate."""
        settings, key, tenant = self.match.settings, None, None
        try:
            raw = self.environ.get(KEY_ENVIRON)  # a server joins repeated fields with ","
            key = parse_key([] if raw is None else [str(raw)])
            if key is None and not settings.require_key:
                return self._run_unkeyed(start_response)
            tenant = self._tenant()
            payload = self.policy.payload(self.request)
        except IdempotencyError as err:
            return refused(err, self.match.operation, tenant, key)
        return self.policy.handler.run(
            self._body, operation=self.match.operation, tenant=tenant, key=key,
            payload=payload, permanent=is_permanent_signal, require_key=settings.require_key,
            **settings.policies,
        )

    def _tenant(self) -> str | None:
        tenant = self.policy.get_tenant(self.request)
        if not (tenant is None or isinstance(tenant, str)):
            raise TypeError("get_tenant must return str | None under WSGI (no awaitables)")
        return tenant

    def _run_unkeyed(self, start_response: StartResponse) -> Outcome:
        """No key on a ``require_key=False`` route: the application answers directly."""
        self.capture.spool.close()  # nothing is captured
        self.unkeyed = IdempotencyContext(
            tenant=None, operation=self.match.operation, key=None, request_hash=None,
            outcome="unkeyed",
        )
        self.environ["idempotency"] = self.unkeyed
        return self.policy.handler.run(
            lambda: self.app(self.environ, start_response),
            operation=self.match.operation, tenant=None, key=None, require_key=False,
        )

    def _body(self) -> dict[str, Any]:
        """The handler's body: the downstream application, captured."""
        ctx = current_context()
        if ctx is not None:
            self.environ["idempotency"] = ctx
            begin_enqueue_scope(ctx)
        self.capture.run(self.app, self.environ)
        return self.capture.finish(self.match, self.policy)

    def _answer(self, outcome: Outcome, start_response: StartResponse) -> Iterable[bytes]:
        """Send what the outcome table says; re-raise what the application raised."""
        ctx = self.unkeyed or outcome.context
        ctx.outcome = outcome.kind
        self.environ["idempotency"] = ctx
        response = library_response(
            outcome, self.match.settings.status_map, self.policy.profile,
            self.policy.handler.logger,
        )
        error = app_exception(outcome)
        if response is not None or error is not None:
            self.capture.spool.close()
        if response is not None:
            return _send(start_response, response)
        if error is not None:
            raise error
        if self.unkeyed is not None:  # the application called start_response itself
            body: Iterable[bytes] = outcome.result
            return body
        return self._send_captured(start_response)

    def _send_captured(self, start_response: StartResponse) -> Iterable[bytes]:
        """The application's own response, every header kept, body possibly from disk."""
        assert self.capture.status_line is not None
        start_response(self.capture.status_line, self.capture.headers)
        return self.capture.iter_body()


__all__ = ["WSGIIdempotencyMiddleware"]
