"""401, 403 and 407 are not the operation's outcome: the key is released without counting or
poisoning, so a retry with fixed credentials runs.  Through a Django-style CSRF middleware
*inside* the protected WSGI stack, a Starlette/FastAPI authentication dependency, and the
endpoints' own answers — on every store, under both profiles."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

import flask
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request

from idempotent_tasks import IdempotencyHandler, Status
from idempotent_tasks.http import (
    ASGIIdempotencyMiddleware,
    HTTPRequest,
    WSGIIdempotencyMiddleware,
)

from ._apps import ASGIDriver, Script, WSGIDriver

MakeDriver = Callable[..., Any]


def new_key() -> str:
    return str(uuid.uuid4())


def tenant(request: HTTPRequest) -> str | None:
    return request.headers.get("x-tenant")


@pytest.fixture(params=["guide", "ietf"])
def profile(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


def assert_released(handler: IdempotencyHandler, operation: str, key: str) -> None:
    assert handler.get_record(operation=operation, tenant="acme", key=key) is None
    assert handler.retry_count(operation=operation, tenant="acme", key=key) == 0


# ------------------------------------------------------------- a CSRF check inside (WSGI)
class CsrfMiddleware:
    """What Django's ``CsrfViewMiddleware`` does for an unsafe method, as plain WSGI: the
    ``X-CSRFToken`` header must carry the session's token, else 403 and the view never
    runs.  (Flask's test client manages the ``Cookie`` header itself, so the session's
    token is fixed here rather than read from a cookie.)"""

    SESSION_TOKEN = "t0k3n"

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("HTTP_X_CSRFTOKEN") != self.SESSION_TOKEN:
            body = b"<h1>Forbidden (403)</h1><p>CSRF verification failed.</p>"
            start_response("403 Forbidden", [("Content-Type", "text/html"),
                                             ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


def test_a_csrf_refusal_inside_the_wsgi_stack_releases_the_key(
    handler: IdempotencyHandler, profile: str
) -> None:
    runs: list[int] = []
    app = flask.Flask(__name__)

    @app.post("/orders")
    def create() -> tuple[dict[str, int], int]:
        runs.append(1)
        return {"order": len(runs)}, 201

    app.wsgi_app = WSGIIdempotencyMiddleware(  # type: ignore[method-assign]
        CsrfMiddleware(app.wsgi_app), handler, get_tenant=tenant, profile=profile,  # type: ignore[arg-type]
        routes=[("POST", "/orders")],
    )
    driver, key = WSGIDriver(app), new_key()
    for _ in range(4):  # more refusals than max_retries (3): none is counted
        refused = driver.request("POST", "/orders", key=key, json={"n": 1},
                                 headers=[("X-CSRFToken", "stale")])
        assert refused.status == 403 and b"CSRF" in refused.content
        assert_released(handler, "POST /orders", key)
    fixed = [("X-CSRFToken", CsrfMiddleware.SESSION_TOKEN)]
    ok = driver.request("POST", "/orders", key=key, json={"n": 1}, headers=fixed)
    assert ok.status == 201 and ok.json() == {"order": 1}
    replay = driver.request("POST", "/orders", key=key, json={"n": 1}, headers=fixed)
    assert replay.content == ok.content and replay.header("idempotent-replayed") == "true"
    assert runs == [1]


# ------------------------------------------------ an authentication dependency (FastAPI)
def fastapi_with_auth(handler: IdempotencyHandler, profile: str, runs: list[int]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(ASGIIdempotencyMiddleware, handler=handler, get_tenant=tenant,
                       profile=profile, routes=[("POST", "/charges")])

    def user(request: Request) -> str:
        auth = request.headers.get("authorization")
        if auth is None:
            raise HTTPException(401, "not authenticated",
                                headers={"WWW-Authenticate": "Bearer"})
        if auth != "Bearer good":
            raise HTTPException(403, "not allowed")
        return "alice"

    @app.post("/charges", status_code=201)
    def charge(who: str = Depends(user)) -> dict[str, Any]:
        runs.append(1)
        return {"by": who, "run": len(runs)}

    return app


def test_an_auth_dependency_refusal_releases_the_key(
    handler: IdempotencyHandler, profile: str
) -> None:
    runs: list[int] = []
    driver, key = ASGIDriver(fastapi_with_auth(handler, profile, runs)), new_key()
    body = {"amount": 5}
    for credentials, status in ((None, 401), ("Bearer bad", 403), (None, 401), (None, 401)):
        headers = [] if credentials is None else [("Authorization", credentials)]
        refused = driver.request("POST", "/charges", key=key, json=body, headers=headers)
        assert refused.status == status
        assert_released(handler, "POST /charges", key)
    good = [("Authorization", "Bearer good")]
    ok = driver.request("POST", "/charges", key=key, json=body, headers=good)
    assert ok.status == 201 and ok.json() == {"by": "alice", "run": 1}
    replay = driver.request("POST", "/charges", key=key, json=body, headers=good)
    assert replay.content == ok.content and replay.header("idempotent-replayed") == "true"
    assert runs == [1]


# ------------------------------------------------------------ the endpoint's own answers
@pytest.mark.parametrize("status", [401, 403, 407])
def test_the_endpoints_own_401_403_407_release_the_key(
    make: MakeDriver, handler: IdempotencyHandler, profile: str, status: int
) -> None:
    script = Script(statuses=[status, status, status, status])
    d = make(handler, script, profile=profile, permanent=lambda s: True)  # even so
    key = new_key()
    for _ in range(4):
        assert d.request("POST", "/payments/7", key=key, json={"a": 1}).status == status
        assert_released(handler, "POST /payments/{id}", key)
    ok = d.request("POST", "/payments/7", key=key, json={"a": 1})
    assert ok.status == 201 and ok.json()["run"] == 5
    record = handler.get_record(operation="POST /payments/{id}", tenant="acme", key=key)
    assert record is not None and record.status is Status.SUCCESS
