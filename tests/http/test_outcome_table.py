"""The outcome table (docs/design.md, "One outcome, one table"), one test per kind, for
the ASGI (FastAPI) and WSGI (Flask) middlewares on every store: the status, ``Retry-After``,
and ``request.state.idempotency.outcome`` / ``environ["idempotency"].outcome``, which is
exactly the :class:`~idempotent_tasks.Outcome` kind."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from idempotent_tasks import IdempotencyContext, IdempotencyHandler
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

from ._apps import ASGIDriver, Resp, Script, WSGIDriver, fastapi_app, flask_app

PAY = "POST /payments/{id}"
PAYLOAD = {"amount": 100}


class Recording:
    """A FastAPI or Flask app behind the middleware, wrapped by an outer layer that keeps the
    context the middleware left on the request once it answered."""

    def __init__(self, framework: str, handler: IdempotencyHandler, script: Script,
                 **options: Any) -> None:
        options.setdefault("get_payload", lambda request: PAYLOAD)
        self.contexts: list[IdempotencyContext | None] = []
        self.driver: ASGIDriver | WSGIDriver
        if framework == "asgi":
            self.driver = ASGIDriver(self._asgi(fastapi_app(handler, script, **options)))
        else:
            app = flask_app(handler, script, **options)
            app.wsgi_app = self._wsgi(app.wsgi_app)  # type: ignore[method-assign]
            self.driver = WSGIDriver(app)

    def _asgi(self, app: Any) -> Callable[..., Any]:
        async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            finally:
                if scope["type"] == "http":
                    self.contexts.append(scope.get("state", {}).get("idempotency"))

        return outer

    def _wsgi(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        def outer(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            try:
                return app(environ, start_response)
            finally:
                self.contexts.append(environ.get("idempotency"))

        return outer

    def post(self, key: str | None, path: str = "/payments/7", **kw: Any) -> tuple[Resp, str]:
        """One request; its response and the ``outcome`` of the context it left."""
        r = self.driver.request("POST", path, key=key, json=PAYLOAD, **kw)
        ctx = self.contexts.pop()
        assert ctx is not None
        return r, ctx.outcome


MakeRecording = Callable[..., Recording]


@pytest.fixture(params=["asgi", "wsgi"])
def make(request: pytest.FixtureRequest) -> MakeRecording:
    def build(handler: IdempotencyHandler, script: Script, **options: Any) -> Recording:
        return Recording(request.param, handler, script, **options)

    return build


def new_key() -> str:
    return str(uuid.uuid4())


def code_of(r: Resp) -> str:
    code: str = r.json()["error"]["code"]
    return code


def test_executed_is_the_response(make: MakeRecording, handler: IdempotencyHandler) -> None:
    script = Script()
    r, outcome = make(handler, script).post(new_key())
    assert (r.status, outcome) == (201, "executed")
    assert r.header("retry-after") is None and r.header("idempotent-replayed") is None
    assert script.runs == 1


def test_replayed_is_the_stored_response(make: MakeRecording, handler: IdempotencyHandler) -> None:
    script = Script()
    app, key = make(handler, script), new_key()
    first, _ = app.post(key)
    r, outcome = app.post(key)
    assert (r.status, outcome) == (201, "replayed")
    assert r.header("idempotent-replayed") == "true" and r.header("retry-after") is None
    assert r.content == first.content and script.runs == 1


@pytest.mark.parametrize(("path", "status"), [("/payments/7", 409), ("/refunds", 425)])
def test_in_progress_is_409_with_retry_after(
    make: MakeRecording, handler: IdempotencyHandler, path: str, status: int
) -> None:
    """Another attempt holds a live lease (``/refunds`` maps the code to 425)."""
    script = Script()
    app, key = make(handler, script), new_key()
    operation = PAY if path == "/payments/7" else "POST /refunds"
    simulate_crash(handler, operation=operation, tenant="acme", key=key, payload=PAYLOAD,
                   lease_timeout=60.0)
    r, outcome = app.post(key, path=path)
    assert (r.status, code_of(r), outcome) == (status, "REQUEST_IN_PROGRESS", "in_progress")
    assert r.header("retry-after") == "1"
    assert script.runs == 0


def test_failed_is_the_apps_own_transient_answer(
    make: MakeRecording, handler: IdempotencyHandler
) -> None:
    script = Script(statuses=[503])
    app, key = make(handler, script), new_key()
    r, outcome = app.post(key)
    assert (r.status, outcome) == (503, "failed")
    assert r.json()["run"] == 1  # the application's body, as it gave it
    assert r.header("retry-after") is None  # the app set none: nothing added
    crashed, crash_outcome = app.post(new_key(), path="/crash")
    assert (crashed.status, crash_outcome) == (500, "failed")
    retried, retried_outcome = app.post(key)
    assert (retried.status, retried_outcome) == (201, "executed")  # released: runs again


def test_poisoned_is_409_request_failed(make: MakeRecording, handler: IdempotencyHandler) -> None:
    """The permanent answer itself goes to the client as the app gave it; every later
    request is refused 409 REQUEST_FAILED."""
    script = Script(statuses=[400])
    app, key = make(handler, script), new_key()
    first, first_outcome = app.post(key)
    assert (first.status, first_outcome) == (400, "poisoned")
    r, outcome = app.post(key)
    assert (r.status, code_of(r), outcome) == (409, "REQUEST_FAILED", "poisoned")
    assert r.header("retry-after") is None
    assert script.runs == 1


def test_rejected_is_400_or_409(make: MakeRecording, handler: IdempotencyHandler) -> None:
    script = Script()
    app, key = make(handler, script), new_key()
    missing, outcome = app.post(None)
    assert (missing.status, code_of(missing), outcome) == (400, "MISSING_KEY", "rejected")
    no_tenant, outcome = app.post(new_key(), tenant=None)
    assert (no_tenant.status, code_of(no_tenant), outcome) == (400, "MISSING_TENANT", "rejected")
    reused = make(handler, script, get_payload=lambda request: {"amount": 1})
    reused.post(key)
    other = make(handler, script, get_payload=lambda request: {"amount": 2})
    r, outcome = other.post(key)
    assert (r.status, code_of(r), outcome) == (
        409, "KEY_REUSED_WITH_DIFFERENT_REQUEST", "rejected"
    )
    assert r.header("retry-after") is None
    assert script.runs == 1


def test_store_unavailable_is_503_with_retry_after(make: MakeRecording, http_store: Store) -> None:
    faulty = FaultyStore(http_store)
    handler = IdempotencyHandler(faulty, metrics=None, outcome_retry_timeout=0.2)
    script = Script()
    app = make(handler, script)
    faulty.fail("create")  # the body does not run
    r, outcome = app.post(new_key())
    assert (r.status, code_of(r), outcome) == (503, "STORE_UNAVAILABLE", "store_unavailable")
    assert r.header("retry-after") == "1"
    assert script.runs == 0
    faulty.heal()
    faulty.fail("mark_success")  # the body ran; its outcome cannot be written
    r, outcome = app.post(new_key())
    assert (r.status, code_of(r), outcome) == (503, "OUTCOME_NOT_RECORDED", "store_unavailable")
    assert r.header("retry-after") == "1"
    assert script.runs == 1


def test_superseded_is_409_with_retry_after(make: MakeRecording, http_store: Store) -> None:
    """The body ran, but froze past its lease while another attempt took the scope over:
    its own response is fenced off and never sent as the operation's answer."""
    clock = FakeClock()
    handler = IdempotencyHandler(http_store, metrics=None, clock=clock, lease_timeout=10)
    key = new_key()

    def take_over(_item: str) -> None:  # the forced lease loss
        clock.advance(11)
        simulate_crash(handler, operation=PAY, tenant="acme", key=key, payload=PAYLOAD)

    script = Script(on_run=take_over)
    r, outcome = make(handler, script).post(key)
    assert (r.status, code_of(r), outcome) == (409, "REQUEST_IN_PROGRESS", "superseded")
    assert r.header("retry-after") == "1"
    assert script.runs == 1


def test_5xx_bodies_name_no_host_port_or_driver_text(make: MakeRecording) -> None:
    """A store that cannot be reached: the 503 says so generically, with a correlation id;
    the driver's message (host, port) goes only to the log line with the same id."""
    from idempotent_tasks import SQLStore, create_logger_adapter

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lines: list[tuple[str, str, dict[str, Any]]] = []
    store = SQLStore(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", connect_timeout=2)
    handler = IdempotencyHandler(
        store, metrics=None, logger=create_logger_adapter(
            lambda level, event, fields: lines.append((level, event, dict(fields)))),
    )
    script = Script()
    r, outcome = make(handler, script).post(new_key())
    assert (r.status, code_of(r), outcome) == (503, "STORE_UNAVAILABLE", "store_unavailable")
    body = r.content.decode()
    assert "127.0.0.1" not in body and str(port) not in body and "psycopg" not in body.lower()
    reference = r.json()["error"]["message"].rsplit("correlation id ", 1)[1].rstrip(")")
    withheld = [f for _, event, f in lines if event == "http_error_detail_withheld"]
    assert [f["correlation_id"] for f in withheld] == [reference]
    assert str(port) in withheld[0]["error"]  # the inside, in the log only
    assert script.runs == 0
    store.close()
