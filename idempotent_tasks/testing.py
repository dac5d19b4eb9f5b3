"""Helpers for users' own tests: a controllable clock, a store that fails on demand, a claim
abandoned as a crashed worker leaves it, a store of its own per test, the assertions a
test of an idempotent task makes (``assert_ran_once``, ``records``), and ``StoreContract``:
the store contract as a pytest test class for anyone writing a store (docs/stores.md).  It is
imported on first use, so that this module needs pytest only for it.

The pytest plugin (``idempotent_tasks.pytest_plugin``, loaded automatically once the package
is installed) builds its fixtures ``idempotency_store``, ``idempotency_handler`` and
``idempotency_clock`` from these; see docs/testing.md.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import (
    Abandon,
    IdempotencyHandler,
    MemoryStore,
    Outcome,
    Record,
    Status,
    StoreUnavailableError,
    current_context,
)
from .stores.base import Store

if TYPE_CHECKING:
    from ._store_contract import StoreContract

_CONTRACT_MODULE = "idempotent_tasks._store_contract"


def __getattr__(name: str) -> Any:
    """``StoreContract``, imported (with pytest) on first use."""
    if name != "StoreContract":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import sys

    if _CONTRACT_MODULE not in sys.modules:
        import pytest

        # The rules are plain asserts in a package module: have pytest explain a failure.
        pytest.register_assert_rewrite(_CONTRACT_MODULE)
    contract: type[StoreContract] = importlib.import_module(_CONTRACT_MODULE).StoreContract
    return contract


class FakeClock:
    """An injectable clock (``IdempotencyHandler(clock=...)``) that moves only when told."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FaultyStore:
    """Wraps a store; calls named in ``failing`` raise ``StoreUnavailableError``.

    ``before`` hooks run before the named call (e.g. to block on an event and force a race
    window deterministically).
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.name = inner.name
        self.failing: set[str] = set()
        self.before: dict[str, Callable[[], None]] = {}
        self.calls: list[str] = []

    def fail(self, *names: str) -> None:
        self.failing.update(names)

    def heal(self) -> None:
        self.failing.clear()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            hook = self.before.get(name)
            if hook is not None:
                hook()
            if name in self.failing or "*" in self.failing:
                raise StoreUnavailableError(f"injected failure in {name}")
            return attr(*args, **kwargs)

        return call


def simulate_crash(
    handler: IdempotencyHandler,
    *,
    operation: str,
    tenant: str,
    key: str,
    payload: Any = None,
    lease_timeout: float | None = None,
) -> int | Outcome:
    """Claim a scope as a worker that dies right after its claim would: the record stays
    PROCESSING with the returned fencing token until its lease expires, and then recovery or
    the next delivery's takeover counts the crashed attempt.  When the scope cannot be
    claimed, the :class:`Outcome` a delivery got instead (a replay or a refusal).

    Built on the public ``handler.run``: the body raises :class:`~idempotent_tasks.Abandon`,
    which the engine lets through without writing anything — the state a SIGKILL leaves."""
    tokens: list[int] = []

    def die() -> None:
        ctx = current_context()
        assert ctx is not None and ctx.fencing_token is not None
        tokens.append(ctx.fencing_token)
        raise Abandon("simulate_crash")

    try:
        return handler.run(die, operation=operation, tenant=tenant, key=key, payload=payload,
                           lease_timeout=lease_timeout)
    except Abandon:
        return tokens[0]


# ----------------------------------------------------------------------------- for users' tests
# What the pytest plugin (``idempotent_tasks.pytest_plugin``) builds its fixtures from, and
# the assertions a test of an idempotent task makes; usable without pytest too.

#: The store a test gets when it names none: a fresh in-process store.
DEFAULT_TEST_STORE = "memory://"


@contextmanager
def isolated_store(url: str | None = None) -> Iterator[Store]:
    """A store of its own for one test: ``memory://`` (the default) gives a fresh in-process
    store; a ``sqlite://``, ``postgresql://`` or ``redis://`` URL gives that real store under
    a table / key prefix no one else uses, with its schema created — and dropped, with every
    record in it, when the block ends.  Nothing outside that prefix is read or written (a
    SQLite file that did not exist is created, and stays, empty of tables)."""
    from .stores.urls import store_from_url, url_scheme

    target = url or DEFAULT_TEST_STORE
    if url_scheme(target) == "memory":
        yield MemoryStore()
        return
    store = store_from_url(target, prefix=f"test_{uuid.uuid4().hex[:12]}")
    try:
        store.create_schema()
        yield store
    finally:
        try:
            _drop(store)
        finally:
            store.close()


def _drop(store: Store) -> None:
    drop = getattr(store, "drop_schema", None)
    if callable(drop):
        drop()


def records(
    handler: IdempotencyHandler,
    *,
    status: Status | str | None = None,
    operation: str | None = None,
    tenant: str | None = None,
) -> list[Record]:
    """Every record of the handler's store (oldest first, expired ones included), optionally
    only those with ``status`` (``"SUCCESS"``, ``"FAILED"``, ``"PROCESSING"``), ``operation``
    or ``tenant``; each with its retry counter."""
    wanted = None if status is None else Status(status)
    out: list[Record] = []
    while True:
        page = handler.list_records(status=wanted, operation=operation, tenant=tenant,
                                    limit=_PAGE, offset=len(out))
        out.extend(page)
        if len(page) < _PAGE:
            return out


_PAGE = 500


def assert_ran_once(
    handler: IdempotencyHandler, *, operation: str, tenant: str, key: str
) -> Record:
    """Assert that the scope's body ran exactly once and succeeded, however many deliveries
    it had: the scope holds a SUCCESS record and counted no failed, crashed or taken-over
    attempt (each of those ran the body, or may have, once more).  Returns the record.

    What it cannot see: a run before the record expired and was purged (the store forgets
    it); count calls in the body for that.
    """
    scope = f"tenant={tenant!r} operation={operation!r} key={key!r}"
    record = handler.get_record(operation=operation, tenant=tenant, key=key)
    if record is None:
        count = handler.retry_count(operation=operation, tenant=tenant, key=key)
        detail = f"{count} failed attempt(s) counted" if count else "it never ran"
        raise AssertionError(f"no record for {scope}: {detail}")
    if record.status is not Status.SUCCESS:
        raise AssertionError(
            f"{scope} is {record.status.value}, not SUCCESS "
            f"(retry counter {record.retry_count})"
        )
    if record.retry_count:
        raise AssertionError(
            f"{scope} succeeded after {record.retry_count} counted failed or crashed "
            f"attempt(s): its body ran up to {record.retry_count + 1} times"
        )
    return record


__all__ = [
    "DEFAULT_TEST_STORE",
    "FakeClock",
    "FaultyStore",
    "StoreContract",
    "assert_ran_once",
    "isolated_store",
    "records",
    "simulate_crash",
]
