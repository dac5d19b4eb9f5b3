"""Views the middleware tests drive: a scripted order endpoint (what it answers next, how
often it ran, what it writes), plus streaming, crashing, decorated and async views."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import router, transaction
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from idempotent_tasks.django import idempotency_exempt, idempotent_view

from .orders.models import Charge


@dataclass
class Script:
    statuses: list[int] = field(default_factory=list)
    runs: int = 0
    contexts: list[Any] = field(default_factory=list)
    on_run: Callable[[Any, str], None] | None = None  # inside the view's atomic block
    gate: Callable[[], None] | None = None  # before it (blocks a request in the view)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, request: Any) -> tuple[int, int]:
        with self.lock:
            self.runs += 1
            self.contexts.append(getattr(request, "idempotency", None))
            return self.runs, (self.statuses.pop(0) if self.statuses else 201)


SCRIPT = Script()


def tenant_of(request: Any) -> str | None:
    """Tests trust a header; a real project resolves the tenant from ``request.user``."""
    tenant: str | None = request.headers.get("X-Tenant")
    return tenant


def reset() -> Script:
    """A fresh script for the next test."""
    global SCRIPT
    SCRIPT = Script()
    return SCRIPT


def _answer(request: Any, item: str) -> HttpResponse:
    if SCRIPT.gate is not None:
        SCRIPT.gate()
    run, status = SCRIPT.next(request)
    data = json.loads(request.body) if request.body else {}
    with transaction.atomic(using=router.db_for_write(Charge)):
        Charge.objects.create(order_id=item, amount=int(data.get("amount", 0)), attempt=run)
        if SCRIPT.on_run is not None:
            SCRIPT.on_run(request, item)
    response = JsonResponse({"id": item, "run": run, "amount": data.get("amount")},
                            status=status)
    response["Location"] = f"/orders/{item}"
    response["X-Run"] = str(run)
    response.set_cookie("s", str(run))
    return response


def order(request: Any, item: str) -> HttpResponse:
    return _answer(request, item)


def stream(request: Any) -> StreamingHttpResponse:
    SCRIPT.next(request)
    return StreamingHttpResponse(iter([b"x" * 600] * 3), content_type="application/octet-stream")


def crash(request: Any) -> HttpResponse:
    SCRIPT.next(request)
    raise RuntimeError("boom")


def ping(request: Any) -> HttpResponse:
    return HttpResponse("pong")


@idempotent_view
def decorated(request: Any, pk: int) -> HttpResponse:
    return _answer(request, str(pk))


@idempotent_view(operation="orders.refund", status_map={"REQUEST_IN_PROGRESS": 425})
def refund(request: Any, pk: int) -> HttpResponse:
    return _answer(request, f"refund-{pk}")


@idempotency_exempt
def exempt(request: Any, item: str) -> HttpResponse:
    return _answer(request, item)


async def async_order(request: Any, item: str) -> HttpResponse:
    run, status = SCRIPT.next(request)
    return JsonResponse({"id": item, "run": run}, status=status)


@idempotent_view
def secured(request: Any, item: str) -> HttpResponse:
    """Reads the session (through ``request.user``) and writes it: what a view behind
    Django's own middleware stack does."""
    run, status = SCRIPT.next(request)
    request.session["last_order"] = item
    return JsonResponse({"id": item, "run": run, "user": str(request.user)}, status=status)
