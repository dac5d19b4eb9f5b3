"""The production guide's testing checklist, for the ASGI (FastAPI) and WSGI (Flask)
middlewares, against the memory, SQLite, PostgreSQL and Redis stores (profile="guide",
the default: these statuses are the guide's)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from idempotent_tasks import IdempotencyHandler, MemoryCache, Status
from idempotent_tasks.http import DEFAULT_REPLAY_HEADERS
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FaultyStore

from ._apps import STREAM_CHUNK, STREAM_CHUNKS, Resp, Script

PAY = "POST /payments/{id}"
MakeDriver = Callable[..., Any]


def new_key() -> str:
    return str(uuid.uuid4())


def pay(driver: Any, key: str | None, amount: int = 100, item: str = "7", **kw: Any) -> Resp:
    r: Resp = driver.request("POST", f"/payments/{item}", key=key, json={"amount": amount}, **kw)
    return r


def content_headers(r: Resp) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers if k.lower() in DEFAULT_REPLAY_HEADERS}


def error_code(r: Resp) -> str:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    code: str = body["error"]["code"]
    return code


def test_duplicate_replays_byte_identical_and_runs_once(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    key = new_key()
    first = pay(d, key)
    second = pay(d, key)
    third = pay(d, key)
    assert script.runs == 1
    assert first.status == 201 and first.json()["run"] == 1
    for replay in (second, third):
        assert replay.status == first.status
        assert replay.content == first.content
        assert content_headers(replay) == content_headers(first)
        assert replay.header("location") == "/payments/7"
        assert replay.header("idempotent-replayed") == "true"
        assert replay.header("set-cookie") is None and replay.header("x-run") is None
    assert first.header("idempotent-replayed") is None
    assert first.header("set-cookie") == "s=1"  # the fresh response keeps every header
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is not None and record.status is Status.SUCCESS


def test_same_key_different_body_is_409_key_reused(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    key = new_key()
    assert pay(d, key, amount=100).status == 201
    reused = pay(d, key, amount=999)
    assert reused.status == 409
    assert error_code(reused) == "KEY_REUSED_WITH_DIFFERENT_REQUEST"
    other_item = pay(d, key, amount=100, item="8")  # another path under the same template
    assert other_item.status == 409
    assert script.runs == 1


def test_permanent_4xx_poisons_and_retry_gets_request_failed(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[422])
    d = make(handler, script)
    key = new_key()
    first = pay(d, key)
    assert first.status == 422 and first.json()["status"] == 422  # the app's own response
    retry = pay(d, key)
    assert retry.status == 409 and error_code(retry) == "REQUEST_FAILED"
    assert script.runs == 1
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is not None and record.status is Status.FAILED


def test_429_is_transient_by_default(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[429])
    d = make(handler, script)
    key = new_key()
    assert pay(d, key).status == 429
    assert handler.get_record(operation=PAY, tenant="acme", key=key) is None
    assert pay(d, key).status == 201
    assert script.runs == 2


def test_transient_5xx_releases_and_re_executes(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[503])
    d = make(handler, script)
    key = new_key()
    first = pay(d, key)
    assert first.status == 503 and first.json()["status"] == 503
    assert handler.get_record(operation=PAY, tenant="acme", key=key) is None
    second = pay(d, key)
    assert second.status == 201 and second.json()["run"] == 2
    assert pay(d, key).content == second.content
    assert script.runs == 2


def test_three_transient_failures_poison(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[500, 502, 503])
    d = make(handler, script)
    key = new_key()
    assert [pay(d, key).status for _ in range(3)] == [500, 502, 503]
    fourth = pay(d, key)
    assert fourth.status == 409 and error_code(fourth) == "REQUEST_FAILED"
    assert script.runs == 3
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is not None and record.status is Status.FAILED and record.retry_count == 3


def test_an_error_response_is_never_recorded_as_success(make: MakeDriver, handler: IdempotencyHandler) -> None:
    """The capture-style rule: a 500 the app answered must not be replayed as the result."""
    script = Script(statuses=[500])
    d = make(handler, script)
    key = new_key()
    failed = pay(d, key)
    assert failed.status == 500
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is None or record.status is not Status.SUCCESS
    retried = pay(d, key)
    assert retried.status == 201 and retried.header("idempotent-replayed") is None
    replay = pay(d, key)
    assert replay.status == 201 and replay.json()["run"] == 2


def test_an_exception_in_the_app_is_transient(
    make: MakeDriver, handler: IdempotencyHandler, http_store: Store
) -> None:
    script = Script()
    d = make(handler, script)
    key = new_key()
    assert d.request("POST", "/crash", key=key).status == 500
    assert handler.get_record(operation="POST /crash", tenant="acme", key=key) is None
    assert d.request("POST", "/crash", key=key).status == 500
    assert script.runs == 2
    assert http_store.get_retry_count(_scope("POST /crash", key)) == 2


def _scope(operation: str, key: str, tenant: str = "acme") -> Any:
    from idempotent_tasks._core.records import Scope

    return Scope(tenant, operation, key)


def test_store_down_is_503_and_the_body_does_not_run(make: MakeDriver, http_store: Store) -> None:
    faulty = FaultyStore(http_store)
    handler = IdempotencyHandler(faulty, metrics=None)
    script = Script()
    d = make(handler, script)
    faulty.fail("create")
    down = pay(d, new_key())
    assert down.status == 503 and error_code(down) == "STORE_UNAVAILABLE"
    assert script.runs == 0
    faulty.heal()
    assert pay(d, new_key()).status == 201


class BrokenCache(MemoryCache):
    name = "broken"

    def get(self, key: str) -> bytes | None:
        raise ConnectionError("cache down")

    def set(self, key: str, value: bytes, ttl: float) -> None:
        raise ConnectionError("cache down")


def test_cache_down_still_works(make: MakeDriver, http_store: Store) -> None:
    handler = IdempotencyHandler(http_store, BrokenCache(), metrics=None)
    script = Script()
    d = make(handler, script)
    key = new_key()
    first = pay(d, key)
    replay = pay(d, key)
    assert first.status == replay.status == 201 and replay.content == first.content
    assert replay.header("idempotent-replayed") == "true"
    assert script.runs == 1


def test_a_working_cache_replays_the_same_bytes(make: MakeDriver, http_store: Store) -> None:
    handler = IdempotencyHandler(http_store, MemoryCache(), metrics=None)
    script = Script()
    d = make(handler, script)
    key = new_key()
    first = pay(d, key)
    replays = [pay(d, key) for _ in range(2)]  # the second one is served by the cache
    assert all(r.content == first.content and r.status == 201 for r in replays)
    assert script.runs == 1


def test_tenants_and_operations_are_isolated(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    key = new_key()
    acme = pay(d, key, tenant="acme")
    globex = pay(d, key, tenant="globex")
    refund = d.request("POST", "/refunds", key=key, json={"amount": 100})
    assert (acme.status, globex.status, refund.status) == (201, 201, 201)
    assert script.runs == 3
    assert pay(d, key, tenant="globex").content == globex.content
    assert script.runs == 3
    assert {c.tenant for c in script.contexts if c} == {"acme", "globex"}


def test_missing_key_and_missing_tenant_are_400(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    no_key = pay(d, None)
    assert no_key.status == 400 and error_code(no_key) == "MISSING_KEY"
    assert no_key.header("content-type") == "application/json"
    no_tenant = pay(d, new_key(), tenant=None)
    assert no_tenant.status == 400 and error_code(no_tenant) == "MISSING_TENANT"
    bad_key = pay(d, "x" * 300)
    assert bad_key.status == 400 and error_code(bad_key) == "INVALID_KEY"
    assert script.runs == 0


def test_unprotected_requests_pass_through(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    assert d.request("GET", "/payments/7", key=None).status == 201  # GET: not an unsafe method
    assert d.request("POST", "/open", key=None).status == 201  # not in routes
    assert d.request("POST", "/open", key=None).status == 201
    assert script.runs == 3


def test_require_key_false_runs_unkeyed_but_dedupes_keyed(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    assert d.request("POST", "/optional", key=None).json()["run"] == 1
    assert d.request("POST", "/optional", key=None).json()["run"] == 2
    key = new_key()
    assert d.request("POST", "/optional", key=key).json()["run"] == 3
    assert d.request("POST", "/optional", key=key).json()["run"] == 3
    assert script.runs == 3


def test_require_key_false_for_the_whole_middleware(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script, require_key=False)
    assert pay(d, None).status == 201 and pay(d, None).status == 201
    assert script.runs == 2


def test_permanent_option_overrides_the_status_classes(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[422, 503])
    d = make(handler, script, permanent={503})
    key = new_key()
    assert pay(d, key).status == 422  # now transient: released
    assert handler.get_record(operation=PAY, tenant="acme", key=key) is None
    assert pay(d, key).status == 503  # now permanent: poisoned
    assert error_code(pay(d, key)) == "REQUEST_FAILED"
    assert script.runs == 2


def test_status_map_of_the_middleware(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script(statuses=[400])
    d = make(handler, script, status_map={"REQUEST_FAILED": 410, "MISSING_KEY": 428})
    key = new_key()
    assert pay(d, key).status == 400
    assert pay(d, key).status == 410
    assert pay(d, None).status == 428


def test_get_payload_selects_the_fields_that_define_the_operation(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script, get_payload=lambda r: {"amount": r.json()["amount"]})
    key = new_key()
    body = {"amount": 5, "trace_id": "a"}
    first = d.request("POST", "/payments/7", key=key, json=body)
    same_op = d.request("POST", "/payments/7", key=key, json={**body, "trace_id": "b"})
    assert same_op.status == 201 and same_op.content == first.content
    assert d.request("POST", "/payments/7", key=key, json={"amount": 6}).status == 409
    not_json = d.request("POST", "/payments/7", key=new_key(), content=b"\xff not json")
    assert not_json.status == 400 and error_code(not_json) == "INVALID_PAYLOAD"
    assert script.runs == 1


def test_the_context_is_on_the_request(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script)
    key = new_key()
    pay(d, key)
    ctx = script.contexts[0]
    assert ctx is not None
    assert (ctx.tenant, ctx.operation, ctx.key) == ("acme", PAY, key)
    assert ctx.request_hash is not None and len(ctx.request_hash) == 64
    assert ctx.outcome == "executed"  # updated once the outcome was recorded
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is not None and record.request_hash == ctx.request_hash


def test_a_response_too_large_to_store_is_delivered_once_then_refused(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script, max_response_bytes=1000)
    key = new_key()
    big = d.request("POST", "/stream", key=key)
    assert big.status == 200 and big.content == STREAM_CHUNK * STREAM_CHUNKS
    retry = d.request("POST", "/stream", key=key)
    assert retry.status == 409 and error_code(retry) == "REQUEST_FAILED"
    assert script.runs == 1
    small = d.request("POST", "/payments/7", key=new_key(), json={"amount": 1})
    assert small.status == 201  # small responses under the same limit are stored as usual
