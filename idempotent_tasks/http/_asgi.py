"""ASGI middleware: Starlette, FastAPI or any raw ASGI application.

Per protected request: read the whole request body (it is hashed), then run the downstream
application through :meth:`IdempotencyHandler.run_async` with a ``receive`` that replays
the body and a ``send`` that captures the response.  Nothing reaches the client until the
outcome is recorded: a 2xx is stored and then sent; any other status is recorded as a
failure (permanent or transient) and then sent; a replay sends the stored response; every
other outcome is answered by the one table of :mod:`._outcome`.

Nothing on this path blocks the event loop.  With an async store (``AsyncSQLStore``,
``AsyncRedisStore``) ``run_async`` awaits every store call on the loop — the native path, no
thread hop; with a sync store each call runs on the handler's own bounded executor
(``async_executor_threads``).  The endpoint reads the scope's retry counter with
``await request.state.idempotency.retry_count_async()`` (the plain attribute would need a
blocking store call on the loop's thread, and refuses).  What the middleware itself does per
request — parsing the key, hashing the body, the tenant getter (awaited when it is a
coroutine) — is in-memory work.

Responses bigger than ``max_response_bytes`` are not buffered beyond the limit: the
middleware starts streaming them to the client and, because such a response can never be
replayed, records the scope as FAILED (a retry gets ``409 REQUEST_FAILED``).  The last chunk
of such a response is held back until that outcome is written, so a client that retries as
soon as the response ends finds the scope FAILED, never still in progress.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from .._core.context import current_context
from .._core.errors import IdempotencyError
from .._core.handler import IdempotencyHandler
from .._core.outcome import Outcome
from .._core.records import IdempotencyContext
from ..enqueue import begin_enqueue_scope
from ..typing import OnFailure, OnInProgress, OnSuccess, Seconds
from ._common import (
    DEFAULT_REPLAY_HEADERS,
    KEY_HEADER_BYTES,
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
    resolve_tenant,
)
from ._keys import parse_key
from ._outcome import app_exception, library_response, refused
from ._profiles import ProfileName
from ._routes import RouteMatch, RouteSpec, StatusPolicy

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: The wrapped application.  Deliberately loose: Starlette's, asgiref's TypedDict-based and
#: hand-written ``dict`` signatures all describe the same protocol.
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class ASGIIdempotencyMiddleware:
    """Idempotency-Key support for an ASGI application (see ``docs/http.md``).

    ``app.add_middleware(ASGIIdempotencyMiddleware, handler=handler, get_tenant=...)`` with
    Starlette/FastAPI, or ``ASGIIdempotencyMiddleware(app, handler, get_tenant=...)``.
    """

    def __init__(
        self,
        app: ASGIApp,
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http":
            match = self.policy.routes.match(scope["method"], scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before sending its body: nothing to do
        exchange = _Exchange(self.app, self.policy, scope, match, body, receive, send)
        await exchange.run()


async def _read_body(receive: Receive) -> bytes | None:
    """The complete request body, or ``None`` if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _request(scope: Scope, match: RouteMatch, body: bytes) -> HTTPRequest:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = bytes(raw_name).decode("latin-1").lower()
        value = bytes(raw_value).decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return HTTPRequest(
        method=scope["method"].upper(), path=scope["path"],
        query_string=bytes(scope.get("query_string", b"")), headers=headers, body=body,
        operation=match.operation, route=match.template, path_params=match.path_params,
        scope=dict(scope) if not isinstance(scope, dict) else scope,
    )


def _app_scope(scope: Scope) -> Scope:
    """The scope the application sees: without ``http.response.*`` extensions (pathsend,
    zero-copy, trailers, push), which would bypass the response capture."""
    extensions = scope.get("extensions") or {}
    if not any(name.startswith("http.response.") for name in extensions):
        return scope
    copy = dict(scope)
    copy["extensions"] = {
        name: value for name, value in extensions.items()
        if not name.startswith("http.response.")
    }
    return copy


class _Replay:
    """``receive`` for the application: the buffered body first, then the real channel
    (so ``http.disconnect`` still arrives)."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        return await self._receive()


class _Capture:
    """``send`` for the application: buffers up to ``limit`` body bytes, then streams."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self.start: Message | None = None
        self.complete = False
        self.streamed = False
        #: A streamed response's last message, sent once the outcome is written (flush).
        self.held: Message | None = None
        self._response: CapturedResponse | None = None  # built once (finish, then the answer)

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and self.start is None:
            self.start = message
            return
        if kind != "http.response.body" or self.start is None or self.complete:
            raise RuntimeError(f"unexpected ASGI message {kind!r} on an idempotent route")
        more = bool(message.get("more_body", False))
        if self.streamed and more:
            await self._send(message)
        elif self.streamed:
            self.held = message
        else:
            chunk = bytes(message.get("body", b""))
            self._chunks.append(chunk)
            self._size += len(chunk)
            if self._size > self._limit:
                await self._stream_through(more)
        self.complete = not more

    async def _stream_through(self, more: bool) -> None:
        assert self.start is not None
        self.streamed = True
        await self._send(self.start)
        body, self._chunks = b"".join(self._chunks), []
        message = {"type": "http.response.body", "body": body, "more_body": more}
        if more:
            await self._send(message)
        else:
            self.held = message

    async def flush(self) -> None:
        """End a streamed response (its outcome is written by now)."""
        held, self.held = self.held, None
        if held is not None:
            await self._send(held)

    def response(self) -> CapturedResponse | None:
        """The buffered response, once complete (``None`` if it was streamed or cut short)."""
        if self.start is None or not self.complete or self.streamed:
            return None
        response = self._response
        if response is None:
            headers = [(bytes(k), bytes(v)) for k, v in self.start.get("headers", [])]
            response = CapturedResponse(int(self.start["status"]), headers, b"".join(self._chunks))
            self._response = response
        return response

    def finish(self, match: RouteMatch, policy: Policy) -> dict[str, Any]:
        """The value to store (a 2xx), or raise the failure the handler must record."""
        if self.start is None or not self.complete:
            raise RuntimeError("the application returned without completing its response")
        status = int(self.start["status"])
        if self.streamed:
            ok = 200 <= status < 300
            raise failure(status, match.settings, None, sent=True,
                          reason="response_too_large" if ok else "unsuccessful_status")
        response = self.response()
        assert response is not None
        failed = classify(response, match.settings, policy)
        if failed is not None:
            raise failed
        return response.to_stored(policy.replay_headers)


async def _send_response(send: Send, response: CapturedResponse) -> None:
    await send({"type": "http.response.start", "status": response.status,
                "headers": response.headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


class _Exchange:
    """One protected request: resolve key, tenant and payload, run, answer the outcome."""

    def __init__(self, app: ASGIApp, policy: Policy, scope: Scope, match: RouteMatch,
                 body: bytes, receive: Receive, send: Send) -> None:
        self.app = app
        self.policy = policy
        self.scope = scope
        self.match = match
        self.request = _request(scope, match, body)
        self.receive = _Replay(body, receive)
        self.send = send
        self.capture = _Capture(send, policy.max_response_bytes)
        self.state: dict[str, Any] = scope.setdefault("state", {})
        self.unkeyed: IdempotencyContext | None = None

    async def run(self) -> None:
        await self._answer(await self._outcome())

    async def _outcome(self) -> Outcome:
        """What happened: the handler's outcome, or the refusal of a bad key, tenant or
        payload found before it ran.  Other exceptions (a getter's bug) propagate."""
        settings, key, tenant = self.match.settings, None, None
        try:
            key = parse_key([bytes(v) for k, v in self.scope.get("headers", [])
                             if bytes(k).lower() == KEY_HEADER_BYTES])
            if key is None and not settings.require_key:
                return await self._run_unkeyed()
            tenant = await resolve_tenant(self.policy, self.request)
            payload = self.policy.payload(self.request)
        except IdempotencyError as err:
            return refused(err, self.match.operation, tenant, key)
        return await self.policy.handler.run_async(
            self._body, operation=self.match.operation, tenant=tenant, key=key,
            payload=payload, permanent=is_permanent_signal, require_key=settings.require_key,
            **settings.policies,
        )

    async def _run_unkeyed(self) -> Outcome:
        """No key on a ``require_key=False`` route: the application answers directly."""
        self.unkeyed = IdempotencyContext(
            tenant=None, operation=self.match.operation, key=None, request_hash=None,
            outcome="unkeyed",
        )
        self.state["idempotency"] = self.unkeyed
        return await self.policy.handler.run_async(
            lambda: self.app(self.scope, self.receive, self.send),
            operation=self.match.operation, tenant=None, key=None, require_key=False,
        )

    async def _body(self) -> dict[str, Any]:
        """The handler's body: the downstream application, captured."""
        ctx = current_context()
        if ctx is not None:
            self.state["idempotency"] = ctx
            begin_enqueue_scope(ctx)
        await self.app(_app_scope(self.scope), self.receive, self.capture)
        return self.capture.finish(self.match, self.policy)

    async def _answer(self, outcome: Outcome) -> None:
        """Send what the outcome table says; re-raise what the application raised."""
        ctx = self.unkeyed or outcome.context
        ctx.outcome = outcome.kind
        self.state["idempotency"] = ctx
        response = library_response(
            outcome, self.match.settings.status_map, self.policy.profile,
            self.policy.handler.logger,
        )
        await self.capture.flush()  # a streamed response ends once its outcome is written
        if response is not None:
            if not self.capture.streamed:  # never a second response after streaming began
                await _send_response(self.send, response)
            return
        captured = self.capture.response()  # None when streamed through, or cut short
        if captured is not None:  # e.g. Starlette's ServerErrorMiddleware sent a 500
            await _send_response(self.send, captured)  # the original, every header kept
        error = app_exception(outcome)
        if error is not None:
            raise error


__all__ = ["ASGIIdempotencyMiddleware"]
