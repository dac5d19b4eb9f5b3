"""The per-operation policies from ``IDEMPOTENT_TASKS``: the top-level keys are the handler's
defaults, ``HTTP``'s win for the middleware's requests and a ``Route(...)`` in ``ROUTES`` wins
over both; ``ON_SUCCESS="reject"`` makes a retry of a success 409 ``DUPLICATE_REJECTED``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from idempotent_tasks.django import IdempotencyMiddleware
from idempotent_tasks.http import Route

from .conftest import idempotency_settings
from .project import views


@pytest.fixture
def script(alias: str) -> Iterator[views.Script]:
    yield views.reset()
    views.reset()


def twice(path: str) -> tuple[Any, Any]:
    client, key = Client(), str(uuid.uuid4())
    headers = {"Idempotency-Key": key, "X-Tenant": "acme"}
    first, second = (
        client.post(path, data=json.dumps({"amount": 1}), content_type="application/json",
                    headers=headers)
        for _ in range(2)
    )
    return first, second


def rejected(response: Any) -> bool:
    body = json.loads(response.content)
    return response.status_code == 409 and body["error"]["code"] == "DUPLICATE_REJECTED"


def test_on_success_at_the_top_level_refuses_a_retry_of_a_success(script: views.Script) -> None:
    with idempotency_settings(ON_SUCCESS="reject"):
        first, second = twice("/orders/7")
    assert first.status_code == 201 and rejected(second)
    assert script.runs == 1


def test_the_http_block_and_a_route_win_over_the_top_level(script: views.Script) -> None:
    from django.conf import settings

    routes = [Route("/orders/{id}", methods=("POST",), on_success="reject"),
              *(r for r in settings.IDEMPOTENT_TASKS["HTTP"]["ROUTES"] if r[1] != "/orders/{id}")]
    with idempotency_settings(ON_SUCCESS="reject", HTTP={"ON_SUCCESS": "replay"}):
        _, replayed = twice("/async/7")
    assert replayed.status_code == 201 and replayed["Idempotent-Replayed"] == "true"
    with idempotency_settings(HTTP={"ON_SUCCESS": "replay", "ROUTES": routes}):
        _, refused = twice("/orders/7")
    assert rejected(refused)
    assert script.runs == 2


def test_a_bad_policy_setting_is_improperly_configured(script: views.Script) -> None:
    with idempotency_settings(HTTP={"ON_IN_PROGRESS": "sometimes"}), pytest.raises(
        ImproperlyConfigured, match="on_in_progress"
    ):
        IdempotencyMiddleware(lambda request: None)
