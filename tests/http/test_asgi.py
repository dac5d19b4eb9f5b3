"""ASGI-specific behaviour: concurrent duplicates (forced with events), per-route status maps,
raw ASGI apps, request-body replay, async ``get_tenant``."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.http import ASGIIdempotencyMiddleware, HTTPRequest

from ._apps import ASGIDriver, Script, fastapi_app


def _gate(script: Script) -> tuple[asyncio.Event, asyncio.Event]:
    entered, release = asyncio.Event(), asyncio.Event()

    async def gate() -> None:
        entered.set()
        await release.wait()

    script.async_gate = gate
    return entered, release


@pytest.mark.parametrize(("path", "expected"), [("/payments/7", 409), ("/refunds", 425)])
def test_concurrent_duplicate_is_refused_in_progress(
    handler: IdempotencyHandler, path: str, expected: int
) -> None:
    """The first request is held inside the endpoint; its duplicate arrives meanwhile."""
    script = Script()
    driver = ASGIDriver(fastapi_app(handler, script))
    key = str(uuid.uuid4())

    async def scenario() -> None:
        entered, release = _gate(script)
        async with driver.client() as client:
            first = asyncio.create_task(driver.arequest(client, "POST", path, key=key, json={"a": 1}))
            await entered.wait()
            duplicate = await driver.arequest(client, "POST", path, key=key, json={"a": 1})
            assert duplicate.status == expected
            assert json.loads(duplicate.content)["error"]["code"] == "REQUEST_IN_PROGRESS"
            assert duplicate.header("retry-after") == "1"
            release.set()
            done = await first
            assert done.status == 201
            again = await driver.arequest(client, "POST", path, key=key, json={"a": 1})
            assert again.content == done.content and again.header("idempotent-replayed") == "true"

    asyncio.run(scenario())
    assert script.runs == 1


class RawApp:
    """A plain ASGI app (no framework) that echoes its body in several chunks."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen_ctx: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls += 1
        self.seen_ctx = scope.get("state", {}).get("idempotency")
        await self.send_echo(send, body)

    @staticmethod
    async def send_echo(send: Any, body: bytes) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"x-echo", b"1")]})
        await send({"type": "http.response.body", "body": b"echo:", "more_body": True})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def test_raw_asgi_app_body_is_replayed_to_the_app_and_response_to_the_client() -> None:
    raw_app = RawApp()

    async def tenant(request: HTTPRequest) -> str:  # async get_tenant is allowed under ASGI
        return "acme"

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    app = ASGIIdempotencyMiddleware(raw_app, handler, get_tenant=tenant, routes=["/echo"])
    driver = ASGIDriver(app)
    first = driver.request("PUT", "/echo", key="k1", content=b"hello")
    second = driver.request("PUT", "/echo", key="k1", content=b"hello")
    assert first.content == second.content == b"echo:hello"
    assert first.header("x-echo") == "1" and second.header("x-echo") is None
    assert second.header("content-type") == "text/plain"
    assert raw_app.calls == 1
    ctx = raw_app.seen_ctx
    assert ctx.operation == "PUT /echo" and ctx.key == "k1" and ctx.outcome == "executed"
    other_method = driver.request("DELETE", "/echo", key="k1", content=b"hello")
    assert other_method.status == 200 and raw_app.calls == 2  # another operation


def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    middleware = ASGIIdempotencyMiddleware(app, handler, get_tenant=lambda r: "acme")

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        return None

    asyncio.run(middleware({"type": "lifespan"}, receive, send))
    assert seen == ["lifespan"]


def test_client_disconnect_before_the_body_runs_nothing() -> None:
    calls: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(1)

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    middleware = ASGIIdempotencyMiddleware(app, handler, get_tenant=lambda r: "acme")
    sent: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = [
                {"type": "http.request", "body": b"par", "more_body": True},
                {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [
        (b"idempotency-key", b"k")], "query_string": b""}
    asyncio.run(middleware(scope, receive, send))
    assert calls == [] and sent == []


def test_a_streamed_response_ends_only_after_its_failed_outcome_is_written(
    handler: IdempotencyHandler,
) -> None:
    """A response too large to store is streamed and recorded FAILED.  Its last chunk is
    held back until that write: a retry racing the end of the response (run here from
    inside the client's ``send`` as the last chunk arrives) gets REQUEST_FAILED, never
    REQUEST_IN_PROGRESS."""

    async def big(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for last in (False, False, True):
            await send({"type": "http.response.body", "body": b"x" * 600, "more_body": not last})

    middleware = ASGIIdempotencyMiddleware(big, handler, get_tenant=lambda r: "acme",
                                           max_response_bytes=1000)
    scope = {"type": "http", "method": "POST", "path": "/big", "query_string": b"",
             "headers": [(b"idempotency-key", b"k-stream")]}
    seen: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def racing_retry() -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []

        async def collect(message: Any) -> None:
            sent.append(message)

        await middleware(dict(scope), receive, collect)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def send(message: Any) -> None:
        seen["body"] += message.get("body", b"")
        if message["type"] == "http.response.body" and not message.get("more_body"):
            record = handler.get_record(operation="POST /big", tenant="acme", key="k-stream")
            seen["status_at_end"] = record.status if record else None
            seen["retry"] = await racing_retry()

    asyncio.run(middleware(dict(scope), receive, send))
    assert seen["body"] == b"x" * 1800
    assert seen["status_at_end"] == "FAILED"
    status, body = seen["retry"]
    assert status == 409 and json.loads(body)["error"]["code"] == "REQUEST_FAILED"
