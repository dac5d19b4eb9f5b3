"""A seeded store per backend (SQLite file, PostgreSQL with a unique table prefix) and a
helper that runs the CLI against it in-process (click's CliRunner)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from idempotent_tasks import IdempotencyHandler
from idempotent_tasks.cli import cli
from idempotent_tasks.stores.base import Store
from idempotent_tasks.stores.urls import store_from_url
from idempotent_tasks.testing import FakeClock, simulate_crash

from .._services import POSTGRES_URL, require
from ..conftest import drop_store, unique_prefix

OP = "payments.charge"
OTHER_OP = "refunds.create"
TENANT = "acme"
OTHER_TENANT = "globex"
PAST = 10_000.0  # seeded records were written this many seconds ago


class Declined(Exception):
    pass


class Flaky(Exception):
    pass


@dataclass
class Seeded:
    """A store holding one record in every interesting state, and the CLI pointed at it."""

    url: str
    prefix: str | None
    store: Store

    @property
    def global_args(self) -> list[str]:
        args = ["--store", self.url]
        if self.prefix:
            args += ["--prefix", self.prefix]
        return args

    def run(self, *args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(cli, [*self.global_args, *args], input=input)

    def handler(self, clock: FakeClock | None = None) -> IdempotencyHandler:
        return IdempotencyHandler(self.store, metrics=None, clock=clock or time.time)


def seed(store: Store) -> None:
    """Write, with a clock ``PAST`` seconds behind, one scope per state:

    * ``k-success`` (acme): SUCCESS, live (ttl 1 day)
    * ``k-poisoned`` (acme): FAILED by a permanent error
    * ``k-stuck`` (acme): PROCESSING, lease expired long ago (a crashed worker)
    * ``k-expired`` (acme): SUCCESS whose ttl (60 s) has passed
    * ``k-flaky`` (acme): no record, retry counter 1 (released after a transient failure)
    * ``k-other`` (globex, refunds.create): SUCCESS
    """
    clock = FakeClock(time.time() - PAST)
    h = IdempotencyHandler(store, metrics=None, clock=clock, lease_timeout=10.0)
    h.execute(lambda: {"charged": 100}, operation=OP, tenant=TENANT, key="k-success",
              payload={"amount": 100})
    clock.advance(1)
    with pytest.raises(Declined):
        h.execute(_raise(Declined("card declined")), operation=OP, tenant=TENANT,
                  key="k-poisoned", payload={"amount": 5}, permanent=(Declined,))
    clock.advance(1)
    simulate_crash(h, operation=OP, tenant=TENANT, key="k-stuck", payload={"amount": 7})
    clock.advance(1)
    h.execute(lambda: "old", operation=OP, tenant=TENANT, key="k-expired", ttl=60.0)
    clock.advance(1)
    with pytest.raises(Flaky):
        h.execute(_raise(Flaky("timeout")), operation=OP, tenant=TENANT, key="k-flaky")
    clock.advance(1)
    h.execute(lambda: {"refunded": True}, operation=OTHER_OP, tenant=OTHER_TENANT,
              key="k-other")


def _raise(exc: Exception):  # type: ignore[no-untyped-def]
    def body() -> None:
        raise exc

    return body


@pytest.fixture(params=["sqlite", "postgres"])
def seeded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Seeded]:
    if request.param == "sqlite":
        url, prefix = f"sqlite:///{tmp_path / 'cli.db'}", None
    else:
        require("postgres")
        url, prefix = POSTGRES_URL, unique_prefix("cli")
    store = store_from_url(url, table_prefix=prefix)
    store.create_schema()
    seed(store)
    try:
        yield Seeded(url, prefix, store)
    finally:
        drop_store(store)


def lines(text: str) -> Sequence[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]
