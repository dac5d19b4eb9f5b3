"""The outcome table of docs/http.md, row by row, on ASGI (FastAPI) and WSGI (Flask) under
both profiles: each row's scenario is forced through the real middleware, and the response
must be what the row says — the kind, the status (or the endpoint's own answer), the body's
format and the headers the library adds.  The rows are read from the page itself, so the
page and the behaviour cannot drift apart."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks import (
    ConfigurationError,
    IdempotencyHandler,
    JSONSerializer,
    MemoryStore,
)
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, FaultyStore, simulate_crash

from ._apps import Resp, Script
from .test_outcome_table import PAY, PAYLOAD, Recording

DOC = Path(__file__).resolve().parents[2] / "docs" / "http.md"


@dataclass(frozen=True)
class Row:
    """A row of the page's table: the kind, and per profile the status the library answers
    with (``None``: the endpoint's or the stored response), and the headers it adds."""

    kind: str
    status: dict[str, int | None]
    retry_after: bool
    replayed: bool


def _doc_rows() -> dict[int, Row]:
    section = DOC.read_text().split("## The outcome table", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[0].isdigit():
            continue
        number, kind, _code, _when, guide, ietf, headers = cells
        rows[int(number)] = Row(
            kind.strip("`"), {"guide": _status(guide), "ietf": _status(ietf)},
            "Retry-After: 1" in headers, "Idempotent-Replayed: true" in headers,
        )
    return rows


def _status(cell: str) -> int | None:
    found = re.match(r"(\d{3})\b", cell)
    return int(found.group(1)) if found else None


ROWS = _doc_rows()


@dataclass
class Answer:
    """What a scenario got: the response, the outcome kind the middleware left on the
    request, and what the endpoint itself answered in that request (``None``: it did not)."""

    response: Resp
    kind: str
    endpoint_status: int | None = None
    first: Resp | None = None  # the response a replayed row must repeat


class Case:
    """One scenario's world: a memory store, a handler, and apps on the framework."""

    def __init__(self, framework: str, profile: str) -> None:
        self.framework, self.profile = framework, profile
        self.store: Store = MemoryStore()
        self.clock = FakeClock()
        self.key = str(uuid.uuid4())

    def handler(self, store: Store | None = None, **options: Any) -> IdempotencyHandler:
        return IdempotencyHandler(store or self.store, metrics=None, clock=self.clock,
                                  outcome_retry_timeout=0.2, **options)

    def app(self, script: Script, handler: IdempotencyHandler | None = None,
            **options: Any) -> Recording:
        return Recording(self.framework, handler or self.handler(), script,
                         profile=self.profile, **options)

    def post(self, app: Recording, key: str | None = None, **kw: Any) -> tuple[Resp, str]:
        return app.post(self.key if key is None else key, **kw)


def executed(case: Case) -> Answer:
    r, kind = case.post(case.app(Script()))
    return Answer(r, kind, endpoint_status=201)


def replayed(case: Case) -> Answer:
    app = case.app(Script())
    first, _ = case.post(app)
    r, kind = case.post(app)
    return Answer(r, kind, first=first)


def replayed_not_http(case: Case) -> Answer:
    handler = case.handler()
    handler.execute(lambda: "written by a task, not a response", operation=PAY, tenant="acme",
                    key=case.key, payload=PAYLOAD)
    r, kind = case.post(case.app(Script(), handler))
    return Answer(r, kind)


def failed(case: Case) -> Answer:
    r, kind = case.post(case.app(Script(statuses=[503])))
    return Answer(r, kind, endpoint_status=503)


def poisoned_now(case: Case) -> Answer:
    r, kind = case.post(case.app(Script(statuses=[400])))
    return Answer(r, kind, endpoint_status=400)


def poisoned_kept(case: Case) -> Answer:
    app = case.app(Script(statuses=[400]), replay_errors=True)
    first, _ = case.post(app)
    r, kind = case.post(app)
    return Answer(r, kind, first=first)


def poisoned_refused(case: Case) -> Answer:
    """The 4xx is kept with the record, but this middleware does not replay errors."""
    handler = case.handler()
    case.post(case.app(Script(statuses=[400]), handler, replay_errors=True))
    r, kind = case.post(case.app(Script(), handler, replay_errors=False))
    return Answer(r, kind)


class _Unreadable(JSONSerializer):
    """Another writer's serializer: one result the JSON serializer cannot read back."""

    MARK = "unreadable"

    def dumps(self, value: Any) -> bytes:
        return b"not json" if value == self.MARK else super().dumps(value)

    def loads(self, data: bytes) -> Any:
        return self.MARK if data == b"not json" else super().loads(data)


def poisoned_unreadable(case: Case) -> Answer:
    writer = case.handler(serializer=_Unreadable())
    writer.execute(lambda: _Unreadable.MARK, operation=PAY, tenant="acme", key=case.key,
                   payload=PAYLOAD)
    r, kind = case.post(case.app(Script()))
    return Answer(r, kind)


def in_progress(case: Case) -> Answer:
    handler = case.handler()
    simulate_crash(handler, operation=PAY, tenant="acme", key=case.key, payload=PAYLOAD,
                   lease_timeout=60.0)
    r, kind = case.post(case.app(Script(), handler))
    return Answer(r, kind)


def superseded(case: Case) -> Answer:
    handler = case.handler(lease_timeout=10)

    def take_over(_item: str) -> None:  # the endpoint froze past its lease
        case.clock.advance(11)
        simulate_crash(handler, operation=PAY, tenant="acme", key=case.key, payload=PAYLOAD)

    r, kind = case.post(case.app(Script(on_run=take_over), handler))
    return Answer(r, kind)


def rejected_input(case: Case) -> Answer:
    r, kind = case.app(Script()).post(None)
    return Answer(r, kind)


def rejected_reuse(case: Case) -> Answer:
    handler = case.handler()
    case.post(case.app(Script(), handler, get_payload=lambda request: {"amount": 1}))
    r, kind = case.post(case.app(Script(), handler, get_payload=lambda request: {"amount": 2}))
    return Answer(r, kind)


def rejected_configuration(case: Case) -> Answer:
    def misconfigured(request: Any) -> str:
        raise ConfigurationError("no tenant resolver for this deployment")

    r, kind = case.post(case.app(Script(), get_tenant=misconfigured))
    return Answer(r, kind)


def store_unavailable(case: Case) -> Answer:
    faulty = FaultyStore(case.store)
    faulty.fail("create")
    r, kind = case.post(case.app(Script(), case.handler(faulty)))  # type: ignore[arg-type]
    return Answer(r, kind)


SCENARIOS: dict[int, Callable[[Case], Answer]] = {
    1: executed, 2: replayed, 3: replayed_not_http, 4: failed, 5: poisoned_now,
    6: poisoned_kept, 7: poisoned_refused, 8: poisoned_unreadable, 9: in_progress,
    10: superseded, 11: rejected_input, 12: rejected_reuse, 13: rejected_configuration,
    14: store_unavailable,
}
ERROR_TYPES = {"guide": "application/json", "ietf": "application/problem+json"}


def test_every_row_of_the_page_has_a_scenario() -> None:
    assert sorted(ROWS) == sorted(SCENARIOS)


@pytest.mark.parametrize("profile", ["guide", "ietf"])
@pytest.mark.parametrize("framework", ["asgi", "wsgi"])
@pytest.mark.parametrize("number", sorted(SCENARIOS))
def test_a_row_of_the_outcome_table(number: int, framework: str, profile: str) -> None:
    row, got = ROWS[number], SCENARIOS[number](Case(framework, profile))
    r = got.response
    assert got.kind == row.kind
    assert (r.header("retry-after") == "1") is row.retry_after
    assert (r.header("idempotent-replayed") == "true") is row.replayed
    status = row.status[profile]
    if status is not None:  # the library answers: the profile's error body
        assert r.status == status
        assert r.header("content-type") == ERROR_TYPES[profile]
    elif got.first is not None:  # the stored response, byte for byte
        assert (r.status, r.content) == (got.first.status, got.first.content)
    else:  # the endpoint's own answer, as it gave it
        assert r.status == got.endpoint_status
        assert r.json()["status"] == got.endpoint_status
