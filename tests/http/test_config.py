"""Construction-time checks and the route template matcher."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, IdempotencyHandler, MemoryStore
from idempotent_tasks.http import ASGIIdempotencyMiddleware, Route, WSGIIdempotencyMiddleware
from idempotent_tasks.http._routes import RouteSettings, RouteTable, default_permanent

MIDDLEWARES = [ASGIIdempotencyMiddleware, WSGIIdempotencyMiddleware]


def _handler(**kw: Any) -> IdempotencyHandler:
    return IdempotencyHandler(MemoryStore(), metrics=None, **kw)


async def _app(*args: Any) -> None:
    return None


@pytest.mark.parametrize("cls", MIDDLEWARES)
def test_get_tenant_is_required(cls: Any) -> None:
    with pytest.raises(ConfigurationError, match="get_tenant"):
        cls(_app, _handler())
    with pytest.raises(ConfigurationError):
        cls(_app, _handler(), get_tenant="acme")


@pytest.mark.parametrize("cls", MIDDLEWARES)
def test_bad_routes_are_refused_at_construction(cls: Any) -> None:
    for routes in (["payments"], ["/p/{id:uuid}"], ["/p/{id"], [("POST",)], [Route("/p", methods="POST")]):  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            cls(_app, _handler(), get_tenant=lambda r: "t", routes=routes)


def test_max_response_bytes_is_capped_by_what_the_handler_can_store() -> None:
    small = ASGIIdempotencyMiddleware(_app, _handler(max_response_bytes=100_000),
                                      get_tenant=lambda r: "t", max_response_bytes=10**9)
    assert small.policy.max_response_bytes < 100_000 * 3 // 4
    with pytest.raises(ConfigurationError):
        ASGIIdempotencyMiddleware(_app, _handler(max_response_bytes=1000), get_tenant=lambda r: "t")


DEFAULTS = RouteSettings(True, {}, default_permanent)


def test_templates_match_segments_ints_and_paths() -> None:
    table = RouteTable(
        [("POST", "/payments/{id:int}"), "/payments/{id}", ("PUT", "/files/{rest:path}")],
        DEFAULTS,
    )
    m = table.match("post", "/payments/42")
    assert m is not None and m.operation == "POST /payments/{id:int}"
    assert m.path_params == {"id": "42"}
    m = table.match("POST", "/payments/abc")
    assert m is not None and m.operation == "POST /payments/{id}"
    m = table.match("DELETE", "/payments/abc")
    assert m is not None and m.operation == "DELETE /payments/{id}"
    assert table.match("GET", "/payments/abc") is None
    assert table.match("POST", "/payments/a/b") is None  # {id} is one segment
    assert table.match("POST", "/payments/42/") is None  # trailing slash is significant
    m = table.match("PUT", "/files/a/b.txt")
    assert m is not None and m.path_params == {"rest": "a/b.txt"}
    assert table.match("POST", "/files/a") is None


def test_literal_parts_are_not_regular_expressions() -> None:
    table = RouteTable(["/v1.0/pay"], DEFAULTS)
    assert table.match("POST", "/v1.0/pay") is not None
    assert table.match("POST", "/v1x0/pay") is None


def test_without_routes_every_unsafe_method_is_protected_per_path() -> None:
    table = RouteTable(None, DEFAULTS)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        m = table.match(method, "/a/1")
        assert m is not None and m.operation == f"{method} /a/1"
    for method in ("GET", "HEAD", "OPTIONS"):
        assert table.match(method, "/a/1") is None


def test_per_route_options_override_the_middleware_defaults() -> None:
    table = RouteTable(
        [Route("/r", require_key=False, status_map={"REQUEST_FAILED": 410}, permanent={500})],
        RouteSettings(True, {"REQUEST_IN_PROGRESS": 425}, default_permanent),
    )
    m = table.match("POST", "/r")
    assert m is not None
    assert m.settings.require_key is False
    assert m.settings.status_map == {"REQUEST_IN_PROGRESS": 425, "REQUEST_FAILED": 410}
    assert m.settings.permanent(500) and not m.settings.permanent(422)


def test_default_classification() -> None:
    assert default_permanent(400) and default_permanent(404) and default_permanent(422)
    assert not any(default_permanent(s) for s in (408, 425, 429, 500, 503, 302))
