"""WSGI-specific behaviour: concurrent duplicates (forced with threading events), a raw WSGI
app using ``write()``, chunked request bodies."""

from __future__ import annotations

import io
import threading
import uuid
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.http import WSGIIdempotencyMiddleware

from ._apps import Resp, Script, WSGIDriver, flask_app


@pytest.mark.parametrize(("path", "expected"), [("/payments/7", 409), ("/refunds", 425)])
def test_concurrent_duplicate_is_refused_in_progress(
    handler: IdempotencyHandler, path: str, expected: int
) -> None:
    script = Script()
    entered, release = threading.Event(), threading.Event()

    def gate() -> None:
        entered.set()
        assert release.wait(10)

    script.gate = gate
    driver = WSGIDriver(flask_app(handler, script))
    key = str(uuid.uuid4())
    results: list[Resp] = []
    first = threading.Thread(
        target=lambda: results.append(driver.request("POST", path, key=key, json={"a": 1}))
    )
    first.start()
    try:
        assert entered.wait(10)
        duplicate = driver.request("POST", path, key=key, json={"a": 1})
        assert duplicate.status == expected
        assert duplicate.json()["error"]["code"] == "REQUEST_IN_PROGRESS"
    finally:
        release.set()
        first.join(10)
    assert results[0].status == 201
    again = driver.request("POST", path, key=key, json={"a": 1})
    assert again.content == results[0].content
    assert script.runs == 1


def _environ(body: bytes, *, chunked: bool = False, key: str = "k") -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/w", "QUERY_STRING": "a=1",
        "HTTP_IDEMPOTENCY_KEY": key, "wsgi.input": io.BytesIO(body),
    }
    if chunked:
        environ["wsgi.input_terminated"] = True
    else:
        environ["CONTENT_LENGTH"] = str(len(body))
    return environ


def test_raw_wsgi_app_with_write_and_chunked_input() -> None:
    calls: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        calls.append(body)
        write = start_response("202 Accepted Later", [("Content-Type", "text/plain")])
        write(b"got:")
        return [body]

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    middleware = WSGIIdempotencyMiddleware(app, handler, get_tenant=lambda r: "acme")
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses.append(status)
        return lambda data: None

    first = b"".join(middleware(_environ(b"payload", chunked=True), start_response))
    second = b"".join(middleware(_environ(b"payload"), start_response))
    assert first == second == b"got:payload"
    assert statuses == ["202 Accepted Later", "202 Accepted Later"]  # reason phrase kept
    assert calls == [b"payload"]
    third = b"".join(middleware(_environ(b"other"), start_response))
    assert b"KEY_REUSED_WITH_DIFFERENT_REQUEST" in third and statuses[-1].startswith("409")


def test_a_spooled_response_is_sent_only_after_its_failed_outcome_is_written() -> None:
    """WSGI spools a response too large to store and sends it once the FAILED outcome is
    written: a retry racing its first bytes already gets REQUEST_FAILED."""

    def big(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [b"x" * 600] * 3

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    middleware = WSGIIdempotencyMiddleware(big, handler, get_tenant=lambda r: "acme",
                                           max_response_bytes=1000)
    seen: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        record = handler.get_record(operation="POST /w", tenant="acme", key="k")
        seen.append((status, record.status if record else None))
        return lambda data: None

    body = b"".join(middleware(_environ(b""), start_response))
    assert body == b"x" * 1800 and seen == [("200 OK", "FAILED")]
    retry = b"".join(middleware(_environ(b""), start_response))
    assert b"REQUEST_FAILED" in retry and seen[-1][0].startswith("409")
