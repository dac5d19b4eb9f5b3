"""The assertion helpers and the fixtures, used in-process (the plugin is loaded in this
project's own runs through its entry point, like in any project that installs the package)."""

from __future__ import annotations

from pathlib import Path

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.testing import (
    FakeClock,
    assert_ran_once,
    isolated_store,
    records,
    simulate_crash,
)

from .._services import POSTGRES_URL, require

SCOPE = {"operation": "orders.charge", "tenant": "acme", "key": "k-1"}


class Declined(Exception):
    pass


def test_the_fixtures_are_wired_together(
    idempotency_handler: IdempotencyHandler, idempotency_clock: FakeClock,
    idempotency_store: MemoryStore,
) -> None:
    assert isinstance(idempotency_store, MemoryStore)
    assert idempotency_handler.clock is idempotency_clock
    idempotency_handler.execute(lambda: 1, **SCOPE)
    (record,) = records(idempotency_handler)
    assert record.created_at == idempotency_clock.now


@pytest.mark.idempotency(max_retries=7, lease_timeout=12)
def test_the_marker_sets_handler_options(idempotency_handler: IdempotencyHandler) -> None:
    assert idempotency_handler.defaults.max_retries == 7
    assert idempotency_handler.defaults.lease_timeout == 12


def test_assert_ran_once_says_what_the_store_holds(
    idempotency_handler: IdempotencyHandler, idempotency_clock: FakeClock
) -> None:
    h = idempotency_handler
    with pytest.raises(AssertionError, match=r"no record .* it never ran"):
        assert_ran_once(h, **SCOPE)
    with pytest.raises(Declined):
        h.execute(_raise(Declined()), **SCOPE, permanent=(Declined,))
    with pytest.raises(AssertionError, match="is FAILED, not SUCCESS"):
        assert_ran_once(h, **SCOPE)
    other = {**SCOPE, "key": "k-2"}
    simulate_crash(h, **other)
    with pytest.raises(AssertionError, match="is PROCESSING, not SUCCESS"):
        assert_ran_once(h, **other)
    released = {**SCOPE, "key": "k-3"}
    with pytest.raises(TimeoutError):
        h.execute(_raise(TimeoutError()), **released)
    with pytest.raises(AssertionError, match=r"no record .* 1 failed attempt"):
        assert_ran_once(h, **released)
    assert h.execute(lambda: "ok", **released) == "ok"
    with pytest.raises(AssertionError, match="ran up to 2 times"):
        assert_ran_once(h, **released)
    fine = {**SCOPE, "key": "k-4"}
    for _ in range(3):
        h.execute(lambda: "ok", **fine)
    assert assert_ran_once(h, **fine).response == "ok"


def test_records_filters_and_pages(idempotency_handler: IdempotencyHandler) -> None:
    for i in range(1203):
        idempotency_handler.execute(lambda: 1, operation="op", tenant="t", key=f"k{i}")
    with pytest.raises(Declined):
        idempotency_handler.execute(_raise(Declined()), operation="other", tenant="u", key="x",
                                    permanent=(Declined,))
    assert len(records(idempotency_handler)) == 1204
    assert len(records(idempotency_handler, status="SUCCESS")) == 1203
    assert [r.key for r in records(idempotency_handler, status="FAILED")] == ["x"]
    assert records(idempotency_handler, tenant="u", operation="op") == []


def test_isolated_store_drops_what_it_made(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'iso.db'}"
    with isolated_store(url) as store:
        IdempotencyHandler(store, metrics=None).execute(lambda: 1, **SCOPE)
        prefix = store.table_prefix  # type: ignore[attr-defined]
        assert prefix.startswith("test_")
        assert any(t.startswith(prefix) for t in sa.inspect(store.engine).get_table_names())  # type: ignore[attr-defined]
    engine = sa.create_engine(url)
    assert sa.inspect(engine).get_table_names() == []
    engine.dispose()


def test_isolated_stores_do_not_share_records() -> None:
    require("postgres")
    with isolated_store(POSTGRES_URL) as a, isolated_store(POSTGRES_URL) as b:
        IdempotencyHandler(a, metrics=None).execute(lambda: 1, **SCOPE)
        assert IdempotencyHandler(b, metrics=None).get_record(**SCOPE) is None


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def body() -> None:
        raise exc

    return body
