"""``profile="ietf"``: the draft's statuses (400 / 422 / 409), RFC 9457 problem details with a
``type`` URL per code that resolves to a section of docs/http.md, and recorded error
responses replayed byte for byte — for FastAPI and Flask on every store."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import ConfigurationError, ErrorCode, IdempotencyHandler, MemoryStore, Status
from idempotent_tasks.http import (
    DEFAULT_REPLAY_HEADERS,
    PROBLEM_TYPE_BASE,
    ASGIIdempotencyMiddleware,
    WSGIIdempotencyMiddleware,
)
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FaultyStore, simulate_crash

from ._apps import STREAM_CHUNK, STREAM_CHUNKS, Resp, Script

PAY = "POST /payments/{id}"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "http.md"
MakeDriver = Callable[..., Any]


def new_key() -> str:
    return str(uuid.uuid4())


def pay(d: Any, key: str | None, amount: int = 100, **kw: Any) -> Resp:
    r: Resp = d.request("POST", "/payments/7", key=key, json={"amount": amount}, **kw)
    return r


def problem(r: Resp, code: str, status: int) -> dict[str, Any]:
    """Check ``r`` is the RFC 9457 answer for ``code`` and return its members."""
    assert r.status == status
    assert r.header("content-type") == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert set(body) == {"type", "title", "status", "detail", "code"}
    assert body["code"] == code and body["status"] == status
    assert body["type"] == f"{PROBLEM_TYPE_BASE}#{code.lower()}"
    assert body["title"] and body["detail"]
    return body


def content_headers(r: Resp) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers if k.lower() in DEFAULT_REPLAY_HEADERS}


# ---------------------------------------------------------------------- the draft's statuses
def test_missing_and_invalid_keys_are_400(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script, profile="ietf")
    problem(pay(d, None), "MISSING_KEY", 400)
    problem(pay(d, '"a", "b"'), "INVALID_KEY", 400)
    problem(pay(d, new_key(), tenant=None), "MISSING_TENANT", 400)
    assert script.runs == 0


def test_key_reused_with_another_request_is_422(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script()
    d = make(handler, script, profile="ietf")
    key = new_key()
    assert pay(d, key, amount=1).status == 201
    reused = pay(d, key, amount=2)
    problem(reused, "KEY_REUSED_WITH_DIFFERENT_REQUEST", 422)
    assert reused.header("retry-after") is None
    assert script.runs == 1


def test_in_progress_is_409_with_retry_after(make: MakeDriver, handler: IdempotencyHandler) -> None:
    script = Script()
    d = make(handler, script, profile="ietf")
    key = new_key()
    simulate_crash(handler, operation=PAY, tenant="acme", key=key,
                   payload=_default_payload(), lease_timeout=60.0)
    busy = pay(d, key)
    problem(busy, "REQUEST_IN_PROGRESS", 409)
    assert busy.header("retry-after") == "1"
    assert script.runs == 0


def _default_payload() -> dict[str, str]:
    """The default payload of ``pay()``'s request (method, path, query, body SHA-256)."""
    import hashlib
    import json

    body = json.dumps({"amount": 100}).encode()
    return {"method": "POST", "path": "/payments/7", "query": "",
            "body_sha256": hashlib.sha256(body).hexdigest()}


def test_store_down_is_503_with_retry_after(make: MakeDriver, http_store: Store) -> None:
    faulty = FaultyStore(http_store)
    handler = IdempotencyHandler(faulty, metrics=None, outcome_retry_timeout=0.2)
    script = Script()
    d = make(handler, script, profile="ietf")
    faulty.fail("create")
    down = pay(d, new_key())
    problem(down, "STORE_UNAVAILABLE", 503)
    assert down.header("retry-after") == "1"
    faulty.heal()
    faulty.fail("mark_success")
    lost = pay(d, new_key())
    problem(lost, "OUTCOME_NOT_RECORDED", 503)
    assert lost.header("retry-after") == "1"


def test_status_map_still_overrides_single_codes(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script()
    d = make(handler, script, profile="ietf",
             status_map={"KEY_REUSED_WITH_DIFFERENT_REQUEST": 409, "MISSING_KEY": 428})
    key = new_key()
    pay(d, key, amount=1)
    problem(pay(d, key, amount=2), "KEY_REUSED_WITH_DIFFERENT_REQUEST", 409)
    problem(pay(d, None), "MISSING_KEY", 428)


def test_the_problem_type_base_is_configurable(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    d = make(handler, Script(), profile="ietf",
             problem_type_base="https://api.example.com/errors/idempotency")
    body = pay(d, None).json()
    assert body["type"] == "https://api.example.com/errors/idempotency#missing_key"


# -------------------------------------------------------------- recorded errors, replayed
@pytest.mark.parametrize("status", [400, 404, 409, 422])
def test_a_permanent_error_response_is_replayed_byte_for_byte(
    make: MakeDriver, handler: IdempotencyHandler, status: int
) -> None:
    script = Script(statuses=[status])
    d = make(handler, script, profile="ietf")
    key = new_key()
    first = pay(d, key)
    assert first.status == status and first.header("idempotent-replayed") is None
    assert first.header("set-cookie") == "s=1"  # the first answer keeps every header
    for _ in range(2):
        again = pay(d, key)
        assert again.status == status and again.content == first.content
        assert content_headers(again) == content_headers(first)
        assert again.header("idempotent-replayed") == "true"
        assert again.header("set-cookie") is None
    assert script.runs == 1
    record = handler.get_record(operation=PAY, tenant="acme", key=key)
    assert record is not None and record.status is Status.FAILED
    assert record.response is not None and record.response["status"] == status


@pytest.mark.parametrize("status", [408, 425, 429, 500, 503])
def test_retryable_answers_are_not_kept(
    make: MakeDriver, handler: IdempotencyHandler, status: int
) -> None:
    script = Script(statuses=[status])
    d = make(handler, script, profile="ietf")
    key = new_key()
    assert pay(d, key).status == status
    assert handler.get_record(operation=PAY, tenant="acme", key=key) is None
    assert pay(d, key).status == 201
    assert script.runs == 2


def test_replay_errors_false_answers_409_request_failed(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script(statuses=[422])
    d = make(handler, script, profile="ietf", replay_errors=False)
    key = new_key()
    assert pay(d, key).status == 422
    problem(pay(d, key), "REQUEST_FAILED", 409)
    assert script.runs == 1


def test_the_guide_profile_can_replay_errors_too(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script(statuses=[422])
    d = make(handler, script, replay_errors=True)
    key = new_key()
    first = pay(d, key)
    again = pay(d, key)
    assert (again.status, again.content) == (422, first.content)
    assert again.header("idempotent-replayed") == "true"
    no_key = pay(d, None)  # and keeps the guide's error bodies
    assert no_key.header("content-type") == "application/json"
    assert no_key.json()["error"]["code"] == "MISSING_KEY"


def test_a_response_too_large_to_keep_is_409_request_failed(
    make: MakeDriver, handler: IdempotencyHandler
) -> None:
    script = Script()
    d = make(handler, script, profile="ietf", max_response_bytes=1000)
    key = new_key()
    big = d.request("POST", "/stream", key=key)
    assert big.status == 200 and big.content == STREAM_CHUNK * STREAM_CHUNKS
    problem(d.request("POST", "/stream", key=key), "REQUEST_FAILED", 409)
    assert script.runs == 1


# ----------------------------------------------------------------------- options, docs
@pytest.mark.parametrize("cls", [ASGIIdempotencyMiddleware, WSGIIdempotencyMiddleware])
def test_profile_options_are_checked_at_construction(cls: Any) -> None:
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    tenant = {"get_tenant": lambda r: "acme"}
    with pytest.raises(ConfigurationError, match="profile"):
        cls(lambda *a: None, handler, profile="stripe", **tenant)
    with pytest.raises(ConfigurationError, match="problem_type_base"):
        cls(lambda *a: None, handler, problem_type_base="https://x", **tenant)
    with pytest.raises(ConfigurationError, match="problem_type_base"):
        cls(lambda *a: None, handler, profile="ietf", problem_type_base=" ", **tenant)


def _anchors(markdown: str) -> set[str]:
    """The fragment ids GitHub (and most Markdown renderers) give the headings."""
    found = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            found.add(text.replace(" ", "-"))
    return found


def test_every_problem_type_resolves_to_a_section_of_the_docs() -> None:
    assert PROBLEM_TYPE_BASE.endswith("/docs/http.md")
    anchors = _anchors(DOCS.read_text())
    missing = [code.value for code in ErrorCode if code.value.lower() not in anchors]
    assert missing == []
