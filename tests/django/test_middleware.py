"""The HTTP checklist for ``IdempotencyMiddleware``, through Django's test client (sync) and
async client, on ``DjangoStore`` over PostgreSQL and SQLite."""

from __future__ import annotations

import gc
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from idempotent_tasks import IdempotencyHandler, Status
from idempotent_tasks.django import DjangoStore, get_handler
from idempotent_tasks.http import HTTPRequest, default_payload
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

from .._wait import budget
from .conftest import idempotency_settings
from .project import views
from .project.orders.models import Charge

ORDER = "POST /orders/{id}"


@pytest.fixture
def script(alias: str) -> Iterator[views.Script]:
    yield views.reset()
    views.reset()


def new_key() -> str:
    return str(uuid.uuid4())


def post(client: Any, path: str, key: str | None = None, tenant: str | None = "acme",
         amount: int = 100) -> Any:
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if tenant is not None:
        headers["X-Tenant"] = tenant
    return client.post(path, data=json.dumps({"amount": amount}),
                       content_type="application/json", headers=headers)


def code(response: Any) -> str:
    body = json.loads(response.content)
    assert set(body) == {"error"}
    value: str = body["error"]["code"]
    return value


def record(key: str, operation: str = ORDER) -> Any:
    return get_handler().get_record(operation=operation, tenant="acme", key=key)


def test_a_duplicate_replays_byte_identical_and_the_view_runs_once(script: views.Script) -> None:
    client, key = Client(), new_key()
    first, second, third = (post(client, "/orders/7", key) for _ in range(3))
    assert script.runs == 1 and Charge.objects.count() == 1
    assert first.status_code == 201 and json.loads(first.content)["run"] == 1
    for replay in (second, third):
        assert replay.status_code == 201 and replay.content == first.content
        assert replay["Content-Type"] == first["Content-Type"]
        assert replay["Location"] == "/orders/7" and replay["Idempotent-Replayed"] == "true"
        assert "X-Run" not in replay and "s" not in replay.cookies  # never replayed
    assert "Idempotent-Replayed" not in first and first.cookies["s"].value == "1"
    stored = record(key)
    assert stored is not None and stored.status is Status.SUCCESS


def test_the_same_key_with_another_body_is_409_key_reused(script: views.Script) -> None:
    client, key = Client(), new_key()
    assert post(client, "/orders/7", key, amount=1).status_code == 201
    reused = post(client, "/orders/7", key, amount=2)
    assert reused.status_code == 409 and code(reused) == "KEY_REUSED_WITH_DIFFERENT_REQUEST"
    assert script.runs == 1


def test_a_permanent_4xx_poisons_and_a_retry_gets_request_failed(script: views.Script) -> None:
    client, key = Client(), new_key()
    script.statuses = [422]
    assert post(client, "/orders/7", key).status_code == 422
    retry = post(client, "/orders/7", key)
    assert retry.status_code == 409 and code(retry) == "REQUEST_FAILED"
    assert script.runs == 1
    assert record(key).status is Status.FAILED


def test_429_and_5xx_are_transient_and_the_third_failure_poisons(script: views.Script) -> None:
    client, key = Client(), new_key()
    script.statuses = [429, 503, 500]
    assert [post(client, "/orders/7", key).status_code for _ in range(3)] == [429, 503, 500]
    assert script.runs == 3
    final = post(client, "/orders/7", key)
    assert final.status_code == 409 and code(final) == "REQUEST_FAILED"


def test_a_transient_failure_is_re_executed(script: views.Script) -> None:
    client, key = Client(), new_key()
    script.statuses = [503]
    assert post(client, "/orders/7", key).status_code == 503
    assert post(client, "/orders/7", key).status_code == 201
    assert script.runs == 2 and get_handler().retry_count(
        operation=ORDER, tenant="acme", key=key) == 1


def test_an_exception_in_the_view_is_a_transient_500(script: views.Script) -> None:
    client, key = Client(raise_request_exception=False), new_key()
    assert post(client, "/crash", key).status_code == 500
    assert post(client, "/crash", key).status_code == 500
    assert script.runs == 2  # released each time, never recorded as a success
    assert record(key, "POST /crash") is None


def test_missing_key_and_missing_tenant_are_400(script: views.Script) -> None:
    client = Client()
    missing_key = post(client, "/orders/7", None)
    missing_tenant = post(client, "/orders/7", new_key(), tenant=None)
    assert missing_key.status_code == 400 and code(missing_key) == "MISSING_KEY"
    assert missing_tenant.status_code == 400 and code(missing_tenant) == "MISSING_TENANT"
    two = Client().post("/orders/7", data="{}", content_type="application/json",
                        headers={"Idempotency-Key": "a, b", "X-Tenant": "acme"})
    assert two.status_code == 400 and code(two) == "INVALID_KEY"
    assert script.runs == 0


def test_unprotected_and_exempt_requests_pass_through(script: views.Script) -> None:
    client, key = Client(), new_key()
    assert client.get("/orders/7").status_code == 201  # GET is never protected
    for _ in range(2):  # listed in ROUTES, but the view is @idempotency_exempt
        assert post(client, "/exempt/7", key).status_code == 201
    assert script.runs == 3 and script.contexts == [None, None, None]


def test_the_context_is_on_the_request(script: views.Script) -> None:
    client, key = Client(), new_key()
    first = post(client, "/orders/7", key)
    replay = post(client, "/orders/7", key)
    ctx = script.contexts[0]
    assert ctx.key == key and ctx.tenant == "acme" and ctx.operation == ORDER
    assert ctx.fencing_token is not None and ctx.outcome == "executed"
    assert first.wsgi_request.idempotency is ctx
    assert replay.wsgi_request.idempotency.outcome == "replayed"


def test_an_in_progress_duplicate_is_409_with_retry_after(script: views.Script) -> None:
    inside, release = threading.Event(), threading.Event()
    script.gate = lambda: (inside.set(), release.wait(budget(20)))  # type: ignore[func-returns-value]
    key, out = new_key(), []

    def first() -> None:
        from django.db import connections

        try:
            out.append(post(Client(), "/orders/7", key).status_code)
        finally:
            connections.close_all()

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(budget(20))
        busy = post(Client(), "/orders/7", key)
        assert busy.status_code == 409 and code(busy) == "REQUEST_IN_PROGRESS"
        assert busy["Retry-After"] == "1"
    finally:
        release.set()
        t.join(budget(20))
    assert out == [201] and script.runs == 1


def test_a_streaming_response_is_delivered_once_then_refused(script: views.Script) -> None:
    client, key = Client(), new_key()
    first = post(client, "/stream", key)
    assert first.status_code == 200 and b"".join(first.streaming_content) == b"x" * 1800
    retry = post(client, "/stream", key)
    assert retry.status_code == 409 and code(retry) == "REQUEST_FAILED"
    assert script.runs == 1


def test_decorated_views_are_protected_with_their_own_options(script: views.Script) -> None:
    client, key = Client(), new_key()
    assert post(client, "/decorated/3/", key).status_code == 201
    assert post(client, "/decorated/3/", key)["Idempotent-Replayed"] == "true"
    assert record(key, "POST /decorated/<int:pk>/") is not None
    assert post(client, "/refunds/3/", key).status_code == 201  # its own operation: a new scope
    assert record(key, "orders.refund") is not None
    assert script.runs == 2


def test_require_key_false_runs_unkeyed_and_still_dedupes_keyed(script: views.Script) -> None:
    with idempotency_settings(HTTP={"REQUIRE_KEY": False}):
        client, key = Client(), new_key()
        assert post(client, "/orders/7", None).status_code == 201
        assert post(client, "/orders/7", None).status_code == 201
        assert script.contexts[0].key is None  # an unkeyed context: nothing deduplicated
        assert post(client, "/orders/7", key).status_code == 201
        assert post(client, "/orders/7", key)["Idempotent-Replayed"] == "true"
    assert script.runs == 3


def test_the_ietf_profile_answers_problem_details(script: views.Script) -> None:
    with idempotency_settings(HTTP={"PROFILE": "ietf"}):
        client, key = Client(), new_key()
        post(client, "/orders/7", key, amount=1)
        reused = post(client, "/orders/7", key, amount=2)
    assert reused.status_code == 422
    assert reused["Content-Type"] == "application/problem+json"
    assert json.loads(reused.content)["code"] == "KEY_REUSED_WITH_DIFFERENT_REQUEST"


def test_store_down_is_503_and_the_view_does_not_run(script: views.Script, alias: str) -> None:
    faulty = FaultyStore(DjangoStore(using=alias))
    handler = IdempotencyHandler(faulty, metrics=None)
    current = {k: v for k, v in get_settings().items() if k not in ("DATABASE", "LEASE_TIMEOUT")}
    with override(current, HANDLER=handler):
        faulty.fail("create")
        down = post(Client(), "/orders/7", new_key())
        assert down.status_code == 503 and code(down) == "STORE_UNAVAILABLE"
        assert down["Retry-After"] == "1" and script.runs == 0
        faulty.heal()
        assert post(Client(), "/orders/7", new_key()).status_code == 201


def test_a_view_that_ran_past_its_lease_is_superseded_409(
    script: views.Script, alias: str
) -> None:
    """The view froze past its lease and another attempt took the scope over (the forced
    lease loss): its completion is fenced off, so the client gets 409 REQUEST_IN_PROGRESS
    with Retry-After — never the stale view's 201 — and the record stays the newer
    attempt's: nothing was recorded as a success by the stale owner."""
    clock = FakeClock()
    handler = IdempotencyHandler(DjangoStore(using=alias), metrics=None, clock=clock,
                                 lease_timeout=10)
    key, newer = new_key(), []
    body = json.dumps({"amount": 100}).encode()  # what post() sends: the default payload's
    payload = default_payload(HTTPRequest(
        method="POST", path="/orders/7", query_string=b"", headers={}, body=body,
        operation=ORDER, route=ORDER, path_params={},
    ))

    def take_over() -> None:  # inside the view, after the middleware's claim
        clock.advance(11)
        newer.append(simulate_crash(handler, operation=ORDER, tenant="acme", key=key,
                                    payload=payload))

    script.gate = take_over
    current = {k: v for k, v in get_settings().items() if k not in ("DATABASE", "LEASE_TIMEOUT")}
    with override(current, HANDLER=handler):
        stale = post(Client(), "/orders/7", key)
    assert stale.status_code == 409 and code(stale) == "REQUEST_IN_PROGRESS"
    assert stale["Retry-After"] == "1" and "Idempotent-Replayed" not in stale
    assert stale.wsgi_request.idempotency.outcome == "superseded"
    assert script.runs == 1 and isinstance(newer[0], int)
    held = handler.get_record(operation=ORDER, tenant="acme", key=key)
    assert held is not None and held.status is Status.PROCESSING
    assert held.fencing_token == newer[0] and held.response is None


def get_settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.IDEMPOTENT_TASKS)


def override(base: dict[str, Any], **changes: Any) -> Any:
    from django.test import override_settings

    alias = base.get("DATABASE") or get_settings().get("DATABASE")
    return override_settings(IDEMPOTENT_TASKS={**base, **changes}, ORDERS_DATABASE=alias)


def test_enqueue_once_in_a_view_publishes_when_its_atomic_block_commits(
    script: views.Script,
) -> None:
    from idempotent_tasks.enqueue import enqueue_once

    from .test_transactional import RecordingTask

    task, during = RecordingTask(), []

    def enqueue(request: Any, item: str) -> None:
        enqueue_once(task, item)
        during.append(len(task.published))

    script.on_run = enqueue  # called inside the view's transaction.atomic()
    key = new_key()
    assert post(Client(), "/orders/7", key).status_code == 201
    assert post(Client(), "/orders/7", key).status_code == 201  # a replay enqueues nothing
    assert during == [0] and len(task.published) == 1


def test_the_async_middleware_replays_through_the_async_client(script: views.Script) -> None:
    client, key = AsyncClient(), new_key()
    headers = {"Idempotency-Key": key, "X-Tenant": "acme"}

    async def twice() -> list[Any]:
        return [await client.post("/async/9", data="{}", content_type="application/json",
                                  headers=headers) for _ in range(2)]

    first, replay = async_to_sync(twice)()
    assert first.status_code == replay.status_code == 201
    assert replay.content == first.content and replay["Idempotent-Replayed"] == "true"
    assert script.runs == 1
    missing = async_to_sync(client.post)("/async/9", data="{}", content_type="application/json",
                                         headers={"Idempotency-Key": key})
    assert missing.status_code == 400 and code(missing) == "MISSING_TENANT"
    end_store_threads()


def end_store_threads() -> None:
    """The async path ran the store's calls on the handler's executor threads, each with a
    Django connection of its own: close the handler, let those threads end, free their
    connections (the test database is dropped at the end of the session)."""
    from idempotent_tasks.django import _settings

    _settings.forget_handler()
    for thread in threading.enumerate():
        if thread.name.startswith("idempotent-tasks-io"):
            thread.join(budget(10))
    gc.collect()
