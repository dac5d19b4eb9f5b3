"""The per-operation policies as middleware and per-route options (FastAPI and Flask): they
reach the engine, a route's value wins over the middleware's, which wins over the handler's,
a duplicate refused by ``on_success="reject"`` is 409 ``DUPLICATE_REJECTED`` (a problem
document under ``profile="ietf"``), and a bad value fails at construction.  The waiting
duplicate under a real server is in test_real_servers.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, IdempotencyHandler, MemoryStore
from idempotent_tasks.http import (
    PROBLEM_TYPE_BASE,
    ASGIIdempotencyMiddleware,
    Route,
    WSGIIdempotencyMiddleware,
)

from ._apps import ROUTES, Resp, Script

MakeDriver = Callable[..., Any]


def new_handler(**kw: Any) -> IdempotencyHandler:
    return IdempotencyHandler(MemoryStore(), metrics=None, **kw)


def twice(d: Any, path: str) -> tuple[Resp, Resp]:
    key = str(uuid.uuid4())
    first: Resp = d.request("POST", path, key=key, json={"amount": 1})
    second: Resp = d.request("POST", path, key=key, json={"amount": 1})
    return first, second


def test_on_success_reject_on_the_middleware_is_409_duplicate_rejected(
    make: MakeDriver,
) -> None:
    script = Script()
    d = make(new_handler(), script, on_success="reject")
    first, second = twice(d, "/payments/7")
    assert first.status == 201
    assert second.status == 409
    assert second.json()["error"]["code"] == "DUPLICATE_REJECTED"
    assert second.header("idempotent-replayed") is None
    assert script.runs == 1


def test_ietf_answers_duplicate_rejected_with_a_problem_document(make: MakeDriver) -> None:
    script = Script()
    d = make(new_handler(), script, on_success="reject", profile="ietf")
    _, second = twice(d, "/payments/7")
    assert second.status == 409
    assert second.header("content-type") == "application/problem+json"
    body = second.json()
    assert body["code"] == "DUPLICATE_REJECTED" and body["status"] == 409
    assert body["type"] == f"{PROBLEM_TYPE_BASE}#duplicate_rejected"
    assert script.runs == 1


def test_a_routes_policy_wins_over_the_middlewares_which_wins_over_the_handlers(
    make: MakeDriver,
) -> None:
    """The handler rejects, the middleware replays, ``/refunds`` rejects again."""
    routes = [r for r in ROUTES if not (isinstance(r, Route) and r.template == "/refunds")]
    routes.append(Route("/refunds", methods=("POST",), on_success="reject"))
    script = Script()
    d = make(new_handler(on_success="reject"), script, routes=routes, on_success="replay")
    _, replayed = twice(d, "/payments/7")
    assert replayed.status == 201 and replayed.header("idempotent-replayed") == "true"
    _, refused = twice(d, "/refunds")
    assert refused.status == 409 and refused.json()["error"]["code"] == "DUPLICATE_REJECTED"
    assert script.runs == 2


async def _app(*args: Any) -> None:
    return None


@pytest.mark.parametrize("cls", [ASGIIdempotencyMiddleware, WSGIIdempotencyMiddleware])
def test_a_bad_policy_is_refused_at_construction(cls: Any) -> None:
    with pytest.raises(ConfigurationError, match="on_success"):
        cls(_app, new_handler(), get_tenant=lambda r: "t", on_success="ignore")
    with pytest.raises(ConfigurationError, match="wait_timeout"):
        cls(_app, new_handler(), get_tenant=lambda r: "t",
            routes=[Route("/p", on_in_progress="wait", wait_timeout=0)])
