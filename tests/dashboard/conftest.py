"""Fixtures for the dashboard: a handler over a store of the test's own with a record in every
state, and the dashboard app over it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from idempotent_tasks import ErrorCode, IdempotencyHandler, Reconciled
from idempotent_tasks.stores.base import Store
from idempotent_tasks.testing import FakeClock, simulate_crash

from ..conftest import drop_store, make_store

TOKEN = "operator-token-for-tests"
LEASE = 30.0


class CardDeclined(Exception):
    """A permanent failure: the scope is poisoned at once."""


@dataclass
class Population:
    """The scopes a populated store holds, by state, and how often each body ran."""

    executed: tuple[str, str, str] = ("acme", "payments.charge", "order-1")
    replayed: tuple[str, str, str] = ("acme", "payments.charge", "order-2")
    poisoned: tuple[str, str, str] = ("acme", "payments.charge", "order/3 with spaces")
    stuck: tuple[str, str, str] = ("globex", "orders.ship", "ship-4")
    live: tuple[str, str, str] = ("globex", "orders.ship", "ship-5")
    #: crashed like ``stuck``; :func:`park_uncertain` turns it UNCERTAIN
    doubtful: tuple[str, str, str] = ("acme", "payments.refund", "refund/6")
    runs: list[str] = field(default_factory=list)


def populate(handler: IdempotencyHandler, clock: FakeClock) -> Population:
    """Records in every state, made the way deliveries make them: executed (and replayed),
    poisoned by a permanent failure, PROCESSING whose lease expired (a crashed worker), and
    PROCESSING with a live lease."""
    pop = Population()

    def charge(name: str) -> dict[str, object]:
        pop.runs.append(name)
        return {"charged": 100, "card": "secret-card-token"}

    def declined() -> None:
        pop.runs.append("poisoned")
        raise CardDeclined("card declined")

    for name in ("executed", "replayed", "replayed"):
        tenant, operation, key = getattr(pop, name)
        handler.run(lambda name=name: charge(name), operation=operation, tenant=tenant, key=key,
                    payload={"order": key})
    tenant, operation, key = pop.poisoned
    outcome = handler.run(declined, operation=operation, tenant=tenant, key=key,
                          permanent=(CardDeclined,))
    assert outcome.kind == "poisoned"
    for crashed in (pop.stuck, pop.doubtful):
        tenant, operation, key = crashed
        simulate_crash(handler, operation=operation, tenant=tenant, key=key,
                       lease_timeout=LEASE)
    clock.advance(LEASE + 5)
    tenant, operation, key = pop.live
    simulate_crash(handler, operation=operation, tenant=tenant, key=key, lease_timeout=LEASE)
    return pop


UNCERTAIN_DETAIL = "processor says <pending>"


def park_uncertain(handler: IdempotencyHandler, pop: Population) -> tuple[str, str, str]:
    """The next delivery of the crashed ``doubtful`` scope asks ``reconcile``, which cannot
    tell: the record becomes UNCERTAIN (on a store that keeps that status)."""
    tenant, operation, key = pop.doubtful
    outcome = handler.run(lambda: pop.runs.append("doubtful"), operation=operation,
                          tenant=tenant, key=key, on_stuck="reconcile",
                          reconcile=lambda ctx: Reconciled.unknown(UNCERTAIN_DETAIL))
    assert outcome.error_code == ErrorCode.OUTCOME_UNCERTAIN, outcome
    return pop.doubtful


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory"])
def dash_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    store = make_store(request.param, tmp_path)
    try:
        yield store
    finally:
        drop_store(store)


@pytest.fixture
def handler(dash_store: Store, clock: FakeClock) -> IdempotencyHandler:
    return IdempotencyHandler(dash_store, clock=clock, metrics=None, lease_timeout=LEASE)


@pytest.fixture
def population(handler: IdempotencyHandler, clock: FakeClock) -> Population:
    return populate(handler, clock)


_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token in a page's hidden form field."""
    found = _CSRF.search(html)
    assert found, "the page has no CSRF field"
    return found.group(1)
