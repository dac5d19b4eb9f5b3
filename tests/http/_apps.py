"""The same small payments API in FastAPI (ASGI) and Flask (WSGI), driven by a ``Script``.

Each protected endpoint asks the script which status to answer next and counts its runs, so
tests can say "the body ran once" exactly.  Drivers give both frameworks one synchronous
``post``/``get`` so that the checklist runs unchanged against either.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import flask
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from idempotent_tasks import IdempotencyContext, IdempotencyHandler
from idempotent_tasks.http import (
    ASGIIdempotencyMiddleware,
    HTTPRequest,
    Route,
    WSGIIdempotencyMiddleware,
)

ROUTES: list[Any] = [
    ("POST", "/payments/{id}"),
    Route("/refunds", methods=("POST",), status_map={"REQUEST_IN_PROGRESS": 425}),
    Route("/optional", methods=("POST",), require_key=False),
    ("POST", "/stream"),
    ("POST", "/crash"),
]
STREAM_CHUNK = b"x" * 600
STREAM_CHUNKS = 3


def tenant_from_header(request: HTTPRequest) -> str | None:
    """Tests trust a header; real apps resolve the tenant from verified credentials."""
    return request.headers.get("x-tenant")


@dataclass
class Script:
    """What the endpoints answer, in order (default 201), and how often they ran."""

    statuses: list[int] = field(default_factory=list)
    runs: int = 0
    contexts: list[IdempotencyContext | None] = field(default_factory=list)
    gate: Callable[[], None] | None = None  # Flask: blocks inside the body
    async_gate: Callable[[], Awaitable[None]] | None = None  # FastAPI: awaits inside the body
    on_run: Callable[[str], None] | None = None  # called with the path parameter
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, ctx: IdempotencyContext | None) -> tuple[int, int]:
        with self.lock:
            self.runs += 1
            self.contexts.append(ctx)
            status = self.statuses.pop(0) if self.statuses else 201
            return self.runs, status


def payment_body(item: str, run: int, status: int, data: Any) -> dict[str, Any]:
    return {"id": item, "run": run, "status": status, "amount": (data or {}).get("amount")}


def response_headers(item: str, run: int) -> dict[str, str]:
    return {"location": f"/payments/{item}", "x-run": str(run), "set-cookie": f"s={run}"}


# ---------------------------------------------------------------------------------- FastAPI
def fastapi_app(handler: IdempotencyHandler, script: Script, **options: Any) -> FastAPI:
    app = FastAPI()
    options.setdefault("routes", ROUTES)
    options.setdefault("get_tenant", tenant_from_header)
    app.add_middleware(ASGIIdempotencyMiddleware, handler=handler, **options)

    async def run(request: Request, item: str) -> Response:
        if script.async_gate is not None:
            await script.async_gate()
        ctx = getattr(request.state, "idempotency", None)
        run_no, status = script.next(ctx)
        if script.on_run is not None:
            script.on_run(item)
        data = await request.json() if await request.body() else None
        return JSONResponse(
            payment_body(item, run_no, status, data), status_code=status,
            headers=response_headers(item, run_no),
        )

    @app.post("/payments/{item}")
    async def pay(item: str, request: Request) -> Response:
        return await run(request, item)

    @app.post("/refunds")
    async def refund(request: Request) -> Response:
        return await run(request, "refund")

    @app.post("/optional")
    async def optional(request: Request) -> Response:
        return await run(request, "optional")

    @app.post("/open")
    async def open_route(request: Request) -> Response:
        return await run(request, "open")

    @app.get("/payments/{item}")
    async def read(item: str, request: Request) -> Response:
        return await run(request, item)

    @app.post("/stream")
    async def stream(request: Request) -> Response:
        script.next(None)

        async def chunks() -> Any:
            for _ in range(STREAM_CHUNKS):
                yield STREAM_CHUNK

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    @app.post("/crash")
    async def crash(request: Request) -> Response:
        script.next(None)
        raise RuntimeError("boom")

    return app


# ------------------------------------------------------------------------------------ Flask
def flask_app(handler: IdempotencyHandler, script: Script, **options: Any) -> flask.Flask:
    app = flask.Flask(__name__)
    options.setdefault("routes", ROUTES)
    options.setdefault("get_tenant", tenant_from_header)
    app.wsgi_app = WSGIIdempotencyMiddleware(app.wsgi_app, handler, **options)  # type: ignore[method-assign]

    def run(item: str) -> flask.Response:
        if script.gate is not None:
            script.gate()
        run_no, status = script.next(flask.request.environ.get("idempotency"))
        if script.on_run is not None:
            script.on_run(item)
        data = flask.request.get_json(silent=True)
        response = flask.jsonify(payment_body(item, run_no, status, data))
        response.status_code = status
        response.headers.update(response_headers(item, run_no))
        return response

    app.add_url_rule("/payments/<item>", "pay", run, methods=["POST", "GET"])
    app.add_url_rule("/refunds", "refund", lambda: run("refund"), methods=["POST"])
    app.add_url_rule("/optional", "optional", lambda: run("optional"), methods=["POST"])
    app.add_url_rule("/open", "open", lambda: run("open"), methods=["POST"])

    @app.post("/stream")
    def stream() -> flask.Response:
        script.next(None)

        def chunks() -> Iterator[bytes]:
            for _ in range(STREAM_CHUNKS):
                yield STREAM_CHUNK

        return flask.Response(chunks(), mimetype="application/octet-stream")

    @app.post("/crash")
    def crash() -> flask.Response:
        script.next(None)
        raise RuntimeError("boom")

    return app


# ---------------------------------------------------------------------------------- drivers
@dataclass
class Resp:
    status: int
    headers: list[tuple[str, str]]
    content: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None

    def json(self) -> Any:
        import json

        return json.loads(self.content)


class Driver(Protocol):
    def request(self, method: str, path: str, *, key: str | None = ..., tenant: str | None = ...,
                json: Any = ..., content: bytes | None = ...,
                headers: list[tuple[str, str]] | None = ...) -> Resp: ...


def _headers(key: str | None, tenant: str | None, json_body: bool,
             extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """The request's header fields, in order; ``extra`` may repeat a name (two
    ``Idempotency-Key`` fields: httpx sends both, Werkzeug joins them with ", ")."""
    headers = []
    if key is not None:
        headers.append(("Idempotency-Key", key))
    if tenant is not None:
        headers.append(("X-Tenant", tenant))
    if json_body:
        headers.append(("Content-Type", "application/json"))
    return headers + list(extra or [])


def _content(json_data: Any, content: bytes | None) -> bytes | None:
    import json as jsonlib

    if json_data is not None:
        return jsonlib.dumps(json_data).encode()
    return content


class ASGIDriver:
    """httpx over the ASGI transport; every call on a fresh event loop."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://test")

    async def arequest(self, client: httpx.AsyncClient, method: str, path: str, *,
                       key: str | None = None, tenant: str | None = "acme", json: Any = None,
                       content: bytes | None = None,
                       headers: list[tuple[str, str]] | None = None) -> Resp:
        r = await client.request(
            method, path, headers=_headers(key, tenant, json is not None, headers),
            content=_content(json, content),
        )
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in r.headers.raw]
        return Resp(r.status_code, headers, r.content)

    def request(self, method: str, path: str, **kwargs: Any) -> Resp:
        async def go() -> Resp:
            async with self.client() as client:
                return await self.arequest(client, method, path, **kwargs)

        return asyncio.run(go())


class WSGIDriver:
    """Flask's test client (a fresh one per call, so threads never share one)."""

    def __init__(self, app: flask.Flask) -> None:
        self.app = app

    def request(self, method: str, path: str, *, key: str | None = None,
                tenant: str | None = "acme", json: Any = None,
                content: bytes | None = None,
                headers: list[tuple[str, str]] | None = None) -> Resp:
        client = self.app.test_client()
        r = client.open(path, method=method,
                        headers=_headers(key, tenant, json is not None, headers),
                        data=_content(json, content))
        return Resp(r.status_code, list(r.headers.items()), r.get_data())
