"""A FastAPI payments API whose ``POST /payments`` is idempotent and enqueues an exactly-once
receipt task (see README.md for the commands).

Configuration (environment): ``STORE_URL`` (default the docker-compose PostgreSQL; the API and
every worker must share it) and ``BROKER_URL`` (default the docker-compose Redis).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor
from idempotent_tasks.http import ASGIIdempotencyMiddleware, HTTPRequest, enqueue_once

STORE_URL = os.environ.get("STORE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")

store = SQLStore(STORE_URL)
store.create_schema()  # idempotent; `idempotent-tasks --store URL migrate` does the same
handler = IdempotencyHandler(store)
broker = RedisBroker(url=BROKER_URL)  # type: ignore[no-untyped-call]
broker.add_middleware(IdempotencyMiddleware(handler))  # before any actor is declared
dramatiq.set_broker(broker)

#: Demo credentials.  The tenant must come from *verified* credentials, never from a header the
#: client can set to anything (one tenant could then replay another's stored responses).
API_KEYS = {"sk_test_acme": "acme", "sk_test_globex": "globex"}
PAYMENTS: dict[str, dict[str, Any]] = {}  # the API's own state, in memory for the example


@idempotent_actor(queue_name="payments_example", max_retries=5, min_backoff=500)
def send_receipt(payment_id: str, email: str) -> None:
    """Runs once per payment however often the request that enqueued it was retried."""
    print(f"receipt for {payment_id} sent to {email}")


def tenant_of(request: HTTPRequest) -> str | None:
    """``Authorization: Bearer <api key>`` → tenant; ``None`` answers 400 MISSING_TENANT."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return API_KEYS.get(token) if scheme.lower() == "bearer" else None


class PaymentIn(BaseModel):
    amount_cents: int
    currency: str
    email: str


app = FastAPI(title="payments (idempotent_tasks example)")
app.add_middleware(
    ASGIIdempotencyMiddleware, handler=handler, get_tenant=tenant_of,
    routes=[("POST", "/payments")],
)


@app.post("/payments", status_code=201)
def create_payment(body: PaymentIn, request: Request) -> JSONResponse:
    if body.amount_cents <= 0:
        raise HTTPException(422, "amount_cents must be positive")  # 4xx: the key is poisoned
    ctx = request.state.idempotency  # tenant, operation, key, request hash, outcome
    # Derive ids from the scope, not uuid4(): a retry after a transient failure then reuses
    # them, and the receipt task it enqueues again carries the same arguments and key.
    payment_id = "pay_" + hashlib.sha256(f"{ctx.tenant}\n{ctx.key}".encode()).hexdigest()[:16]
    PAYMENTS[payment_id] = {"id": payment_id, "tenant": ctx.tenant, **body.model_dump()}
    enqueue_once(send_receipt, payment_id, body.email)
    return JSONResponse(
        PAYMENTS[payment_id], status_code=201, headers={"Location": f"/payments/{payment_id}"}
    )


@app.get("/payments/{payment_id}")
def get_payment(payment_id: str) -> dict[str, Any]:
    if payment_id not in PAYMENTS:
        raise HTTPException(404)
    return PAYMENTS[payment_id]
