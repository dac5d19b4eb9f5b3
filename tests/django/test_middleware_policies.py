"""The per-operation policies from ``IDEMPOTENT_TASKS``: the top-level keys are the handler's
defaults, ``HTTP``'s win for the middleware's requests and a ``Route(...)`` in ``ROUTES`` wins
over both; ``ON_SUCCESS="reject"`` makes a retry of a success 409 ``DUPLICATE_REJECTED``;
``RECONCILE`` is a dotted path in both blocks."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from idempotent_tasks import IdempotencyHandler, MemoryStore, Reconciled
from idempotent_tasks.django import IdempotencyMiddleware, get_handler
from idempotent_tasks.http import Route
from idempotent_tasks.testing import FakeClock, simulate_crash

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


def undecided(ctx: Any) -> Reconciled:
    """The HTTP block's ``RECONCILE`` (imported by its dotted path)."""
    return Reconciled.unknown("the charge is not found nor refused")


def not_asked(ctx: Any) -> Reconciled:
    raise AssertionError("the HTTP block's RECONCILE wins for the middleware's requests")


def one_payload(request: Any) -> dict[str, int]:
    return {"n": 1}


def test_reconcile_is_a_dotted_path_at_the_top_level_and_in_the_http_block(
    script: views.Script,
) -> None:
    """Top level: the handler's ``reconcile`` (imported like ``GET_TENANT``); ``HTTP``: the
    middleware's.  A request after a crashed attempt whose lease expired is answered by the
    HTTP block's: 409 ``OUTCOME_UNCERTAIN`` with its detail, the view never runs."""
    here = __name__
    with idempotency_settings(ON_STUCK="reconcile", RECONCILE=f"{here}.not_asked"):
        assert get_handler().defaults.reconcile is not_asked
    with idempotency_settings(RECONCILE=f"{here}.missing"), pytest.raises(
        ImproperlyConfigured, match="RECONCILE"
    ):
        get_handler()
    clock, key = FakeClock(), str(uuid.uuid4())
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=30,
                                 on_stuck="reconcile", reconcile=not_asked)
    crashed = simulate_crash(handler, operation="POST /orders/{id}", tenant="acme", key=key,
                             payload={"n": 1})
    assert isinstance(crashed, int)
    clock.advance(31)
    from django.conf import settings

    given = {k: v for k, v in settings.IDEMPOTENT_TASKS.items() if k not in ("DATABASE",
                                                                               "LEASE_TIMEOUT")}
    http = {**given["HTTP"], "RECONCILE": f"{here}.undecided",
            "GET_PAYLOAD": f"{here}.one_payload"}
    with override_settings(IDEMPOTENT_TASKS={**given, "HANDLER": handler, "HTTP": http}):
        response = Client().post("/orders/7", data=json.dumps({"amount": 1}),
                                 content_type="application/json",
                                 headers={"Idempotency-Key": key, "X-Tenant": "acme"})
    error = json.loads(response.content)["error"]
    assert response.status_code == 409 and error["code"] == "OUTCOME_UNCERTAIN"
    assert "the charge is not found nor refused" in error["message"]
    assert script.runs == 0
