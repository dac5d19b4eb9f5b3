"""The app that tests/http/test_real_servers.py runs in real server processes: the same small
API as FastAPI (``asgi_app``, for uvicorn) and Flask (``wsgi_app``, for gunicorn), both on one
PostgreSQL store, so two processes share every key.

Configured from the environment (set by the test): ``IT_STORE_URL``, ``IT_TABLE_PREFIX``,
``IT_RUN_LOG`` (one line per execution of an endpoint: ``<pid> <key>``), ``IT_PROFILE``,
``IT_EVENT_LOG`` (optional: the handler's ``duplicate_waiting`` events, ``<event> <key>``).
``/waited/{id}`` is ``/orders/{id}`` on a route with ``on_in_progress="wait"``: a duplicate
sent while the first is in flight waits for it and answers with its response.
A request whose JSON body says ``"hold": <port>`` connects to that loopback port once
inside the endpoint, says ``entered`` and waits for ``go`` — the test's barrier that keeps
the first request in flight while its duplicates arrive.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from collections.abc import Mapping
from typing import Any

import flask
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from idempotent_tasks import IdempotencyHandler, SQLStore, create_logger_adapter
from idempotent_tasks.http import (
    ASGIIdempotencyMiddleware,
    HTTPRequest,
    Route,
    WSGIIdempotencyMiddleware,
)

BARRIER_TIMEOUT = 20.0
ROUTES = [
    ("POST", "/orders/{id}"),
    ("POST", "/upload"),
    Route("/waited/{id}", methods=("POST",), on_in_progress="wait", wait_timeout=BARRIER_TIMEOUT),
]
#: The handler events written to ``IT_EVENT_LOG`` (what a test waits for).
LOGGED_EVENTS = frozenset({"duplicate_waiting"})


def _log_event(level: str, message: str, fields: Mapping[str, Any]) -> None:
    path = os.environ.get("IT_EVENT_LOG")
    if path and message in LOGGED_EVENTS:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{message} {fields.get('key')}\n")


def _handler() -> IdempotencyHandler:
    store = SQLStore(os.environ["IT_STORE_URL"], table_prefix=os.environ["IT_TABLE_PREFIX"])
    return IdempotencyHandler(store, metrics=None, logger=create_logger_adapter(_log_event))


def _tenant(request: HTTPRequest) -> str | None:
    return request.headers.get("x-tenant")


def _options() -> dict[str, Any]:
    return {"get_tenant": _tenant, "routes": ROUTES, "profile": os.environ["IT_PROFILE"]}


def _ran(key: str | None) -> None:
    with open(os.environ["IT_RUN_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()} {key}\n")


def _barrier(body: bytes) -> None:
    """Block inside the endpoint when the test asked for it (see the module docstring)."""
    try:
        port = json.loads(body).get("hold")
    except ValueError:
        return
    if not port:
        return
    with socket.create_connection(("127.0.0.1", int(port)), timeout=BARRIER_TIMEOUT) as conn:
        conn.sendall(b"entered")
        if conn.recv(2) != b"go":
            raise RuntimeError("the test's barrier went away")


def _order(order_id: str, key: str | None) -> dict[str, Any]:
    return {"order": order_id, "key": key, "pid": os.getpid()}


def _upload(body: bytes) -> dict[str, Any]:
    return {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}


# ------------------------------------------------------------------------ ASGI (uvicorn)
asgi_app = FastAPI()
asgi_app.add_middleware(ASGIIdempotencyMiddleware, handler=_handler(), **_options())


@asgi_app.post("/orders/{order_id}")
@asgi_app.post("/waited/{order_id}")
async def asgi_order(order_id: str, request: Request) -> JSONResponse:
    key = request.state.idempotency.key
    await asyncio.to_thread(_barrier, await request.body())  # the loop keeps serving
    _ran(key)
    return JSONResponse(_order(order_id, key), status_code=201)


@asgi_app.post("/upload")
async def asgi_upload(request: Request) -> JSONResponse:
    body = await request.body()
    _ran(request.state.idempotency.key)
    return JSONResponse(_upload(body), status_code=201)


# ------------------------------------------------------------------------ WSGI (gunicorn)
wsgi_app = flask.Flask(__name__)


@wsgi_app.post("/orders/<order_id>")
@wsgi_app.post("/waited/<order_id>")
def wsgi_order(order_id: str) -> tuple[dict[str, Any], int]:
    key = flask.request.environ["idempotency"].key
    _barrier(flask.request.get_data())
    _ran(key)
    return _order(order_id, key), 201


@wsgi_app.post("/upload")
def wsgi_upload() -> tuple[dict[str, Any], int]:
    body = flask.request.get_data()
    _ran(flask.request.environ["idempotency"].key)
    return _upload(body), 201


wsgi_app.wsgi_app = WSGIIdempotencyMiddleware(  # type: ignore[method-assign]
    wsgi_app.wsgi_app, _handler(), **_options()
)
