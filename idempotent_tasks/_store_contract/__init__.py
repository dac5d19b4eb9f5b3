"""``StoreContract``: the store contract as a pytest test class (re-exported lazily by
:mod:`idempotent_tasks.testing`, so that only its users need pytest).

Subclass it and give it a store, and every rule of :mod:`idempotent_tasks.stores.base` runs
against that store: atomic claims under concurrency, monotonic fencing, writes conditional on
(PROCESSING, token), counters that outlive records, expiry, batches, recovery and cleanup,
named leases, the operators' calls, the optional ``reopen`` primitive
(:mod:`idempotent_tasks.stores.reopen`) and the optional recorded steps and UNCERTAIN status
(:mod:`idempotent_tasks.stores.effects`) and the optional change feed
(:mod:`idempotent_tasks.stores.changes`); optional rules are skipped on a store without them.  A
store that breaks a rule fails at least one test.

* A sync store: a fixture ``store`` (on the class, in the module or in a ``conftest.py``)
  that yields a fresh, isolated store with its schema created, and cleans up after itself.
* An async store: a fixture ``async_store`` **on the class** that returns one, not yet used
  (constructors never connect).  The class runs its coroutines on an event loop of its own,
  on a background thread: it awaits ``create_schema()`` first, and ``drop_schema()`` (when
  the store has one) and ``close()`` after the test.  Concurrent calls of the race rules
  become concurrent coroutines on that loop.

Every rule gets a fresh store and assumes it starts empty; timestamps are passed in (the
rules never wait for a clock), races are forced with barriers, never sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ._changes import ChangeFeedRules
from ._effects import StepRules, UncertainRules
from ._face import BlockingStore, blocking
from ._fencing import FencingRules, RaceRules
from ._hot_path import HotPathRules
from ._operations import AdminRules, BatchRules, MaintenanceRules
from ._reopen import ReopenRules


def _blocking_store(self: Any, async_store: Any) -> Iterator[BlockingStore]:
    """The class's ``async_store``, its coroutines run on a loop of its own."""
    with blocking(async_store) as store:
        yield store


_ASYNC_FACE = pytest.fixture(name="store")(_blocking_store)


class StoreContract(HotPathRules, FencingRules, RaceRules, BatchRules, MaintenanceRules,
                    AdminRules, ReopenRules, StepRules, UncertainRules, ChangeFeedRules):
    """The store contract, one test per rule; see the module docstring.

    ::

        from idempotent_tasks.testing import StoreContract

        class TestMyStore(StoreContract):
            @pytest.fixture
            def store(self, tmp_path):
                store = MyStore(tmp_path / "idem.db")
                store.create_schema()
                yield store
                store.close()
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # An async store's class gets the ``store`` the rules ask for, built from its
        # ``async_store``; a sync store's ``store`` is the user's own, wherever defined.
        if hasattr(cls, "async_store") and not hasattr(cls, "store"):
            cls.store = _ASYNC_FACE  # type: ignore[attr-defined]


__all__ = ["StoreContract"]
