"""A replay goes out with the security headers of the first response, wherever
``IdempotencyMiddleware`` sits in Django's own middleware stack, and never with another
client's cookies."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings

from .project import views

OURS = "idempotent_tasks.django.IdempotencyMiddleware"
#: ``django-admin startproject``'s stack.
DJANGO_STACK = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
SECURITY = ("X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy",
            "Cross-Origin-Opener-Policy")


def stack(position: int) -> list[str]:
    return [*DJANGO_STACK[:position], OURS, *DJANGO_STACK[position:]]


#: Ours right after AuthenticationMiddleware (the documented place), outermost, innermost.
ORDERS = {"after-authentication": stack(5), "outermost": stack(0), "innermost": stack(7)}


@pytest.fixture(params=sorted(ORDERS))
def middleware(request: pytest.FixtureRequest, alias: str) -> Iterator[views.Script]:
    sessions = "django.contrib.sessions.backends.cache"  # the session needs no table here
    with override_settings(MIDDLEWARE=ORDERS[request.param], SESSION_ENGINE=sessions):
        yield views.reset()
    views.reset()


def post(client: Client, key: str) -> Any:
    return client.post("/secured/o-1", data=json.dumps({"amount": 1}),
                       content_type="application/json",
                       headers={"Idempotency-Key": key, "X-Tenant": "acme"})


def vary(response: Any) -> set[str]:
    return {v.strip().lower() for v in response.get("Vary", "").split(",") if v.strip()}


def test_a_replay_keeps_every_security_header_of_the_first_response(
    middleware: views.Script,
) -> None:
    client, key = Client(), str(uuid.uuid4())
    first, replay = post(client, key), post(client, key)
    assert middleware.runs == 1 and first.status_code == replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true" and replay.content == first.content
    assert first["X-Frame-Options"] == "DENY" and "cookie" in vary(first)
    for name in SECURITY:
        assert replay[name] == first[name], name
    assert vary(replay) == vary(first)


def test_a_replay_to_another_client_carries_none_of_the_first_clients_cookies(
    middleware: views.Script,
) -> None:
    key = str(uuid.uuid4())
    first = post(Client(), key)
    assert first.cookies["sessionid"].value  # the view wrote the session
    replay = post(Client(), key)
    assert middleware.runs == 1 and replay["Idempotent-Replayed"] == "true"
    assert "Set-Cookie" not in replay and not replay.cookies


def test_the_stored_headers_are_the_responses_own_on_every_framework() -> None:
    """ASGI, WSGI and Django store through the same ``DEFAULT_REPLAY_HEADERS``: security and
    content headers kept, cookies and per-transmission headers dropped."""
    from idempotent_tasks.http import DEFAULT_REPLAY_HEADERS
    from idempotent_tasks.http._common import CapturedResponse

    sent = [(k.encode(), v.encode()) for k, v in (
        ("Content-Type", "application/json"), ("X-Frame-Options", "DENY"),
        ("Content-Security-Policy", "default-src 'self'"), ("Referrer-Policy", "same-origin"),
        ("Strict-Transport-Security", "max-age=3600"), ("Vary", "Cookie"),
        ("Set-Cookie", "sessionid=abc"), ("Date", "Tue, 01 Dec 2026 22:00:00 GMT"),
        ("Server", "uvicorn"), ("X-Request-Id", "r-1"))]
    stored = CapturedResponse(201, sent, b"{}").to_stored(DEFAULT_REPLAY_HEADERS)
    kept = {name.lower() for name, _ in stored["headers"]}
    assert kept == {"content-type", "x-frame-options", "content-security-policy",
                    "referrer-policy", "strict-transport-security", "vary"}
