"""The flat path (``_core/flat.py``) answers every delivery exactly as the generator flow.

A synchronous ``handler.run`` / ``execute`` on a store without a cache takes the flat path;
the flow is what a tracer, a cache, an async store or a transactional body take.  Each
scenario below runs twice on fresh stores — once through ``handler.run`` (flat), once through
the flow driven by hand — and the outcomes and the records they leave must be the same.
The scenarios are the flat path's hand-overs to the flow: a duplicate that needs I/O, a body
that raised, a result that cannot be stored, a SUCCESS write refused or failing, the
change-feed announcement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from idempotent_tasks import IdempotencyHandler, MemoryStore, Outcome, current_context
from idempotent_tasks._core import calls
from idempotent_tasks._core.calls import build_flow
from idempotent_tasks._core.drivers import drive
from idempotent_tasks._core.errors import StoreUnavailableError
from idempotent_tasks._core.records import Scope
from idempotent_tasks.caches.memory import MemoryCache
from idempotent_tasks.testing import FaultyStore

OP, TENANT = "flat.op", "acme"
Run = Callable[..., Outcome]


def _runner(handler: IdempotencyHandler, flat: bool) -> Run:
    def run(fn: Callable[[], Any], key: str | None = "k", payload: Any = None,
            permanent: tuple[type[BaseException], ...] = (), **opts: Any) -> Outcome:
        if flat:
            return handler.run(fn, operation=OP, tenant=TENANT, key=key, payload=payload,
                               permanent=permanent, require_key=key is not None, **opts)
        engine = handler._engine
        flow = build_flow(engine, fn, OP, TENANT, key, payload, permanent, False,
                          key is not None, False, opts or None)
        return flow if isinstance(flow, Outcome) else drive(engine, flow)
    return run


def _scope(key: str = "k") -> Scope:
    return Scope(TENANT, OP, key)


def _hash(handler: IdempotencyHandler, payload: Any = None) -> str:
    return handler._engine.hash_payload(_scope(), payload)


def first_and_replay(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(lambda: {"n": 1}), run(lambda: {"n": 2})]


def key_reused(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(lambda: 1, payload={"a": 1}), run(lambda: 2, payload={"a": 2})]


def transient_then_success(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    def boom() -> None:
        raise ValueError("transient")
    return [run(boom), run(lambda: "second")]


def permanent_then_duplicate(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    def boom() -> None:
        raise KeyError("permanent")
    return [run(boom, permanent=(KeyError,)), run(lambda: "never")]


def unstorable_result(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(object), run(lambda: "never")]


def in_progress(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    now = time.time()
    s.inner.create(_scope(), request_hash=_hash(h), now=now, lease_expires_at=now + 3600)
    return [run(lambda: "never")]


def expired_lease(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    now = time.time()
    s.inner.create(_scope(), request_hash=_hash(h), now=now - 10, lease_expires_at=now - 5)
    return [run(lambda: "taken over"), run(lambda: "never")]


def superseded(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    def overtaken() -> str:
        ctx = current_context()
        assert ctx is not None and ctx.fencing_token is not None
        # another worker takes the scope over while this body runs (as if past its lease)
        later = time.time() + 7200
        assert s.inner.take_over(_scope(), expected_token=ctx.fencing_token, now=later,
                                 lease_expires_at=later + 3600) is not None
        return "stale"
    return [run(overtaken)]


def write_fails_once(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    failures = [1]

    def flaky() -> None:
        if failures:
            failures.pop()
            raise StoreUnavailableError("injected: connection lost")
    s.before["mark_success"] = flaky
    return [run(lambda: "kept"), run(lambda: "never")]


def write_never_lands(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    s.fail("mark_success")
    return [run(lambda: "lost")]


def claim_fails(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    s.fail("create")
    return [run(lambda: "never")]


def waiting_policy(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(lambda: "announced", on_in_progress="wait"),
            run(lambda: "never", on_in_progress="wait")]


def unkeyed(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(lambda: "free", key=None), run(lambda: "free again", key=None)]


def bad_input(h: IdempotencyHandler, s: FaultyStore, run: Run) -> list[Outcome]:
    return [run(lambda: "never", key="\x00"), run(lambda: "never", payload={1: "a"})]


SCENARIOS = [
    first_and_replay, key_reused, transient_then_success, permanent_then_duplicate,
    unstorable_result, in_progress, expired_lease, superseded, write_fails_once,
    write_never_lands, claim_fails, waiting_policy, unkeyed, bad_input,
]


def _play(scenario: Callable[..., list[Outcome]], flat: bool) -> tuple[Any, ...]:
    store = FaultyStore(MemoryStore())
    handler = IdempotencyHandler(store, metrics=None, outcome_retry_timeout=0.2)
    outcomes = scenario(handler, store, _runner(handler, flat))
    record = store.inner.get(_scope())
    seen = [(o.kind, o.result, o.error_code, o.error, o.retry_count, o.fencing_token, o.ran)
            for o in outcomes]
    kept = None if record is None else (record.status, record.response, record.fencing_token)
    return seen, kept, store.inner.get_retry_count(_scope()), store.calls


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_the_flat_path_answers_as_the_flow(scenario: Callable[..., list[Outcome]]) -> None:
    assert _play(scenario, flat=True) == _play(scenario, flat=False)


def test_a_body_interrupted_by_a_base_exception_is_recorded_then_propagates() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    kept = []
    for flat in (True, False):
        store = MemoryStore()
        run = _runner(IdempotencyHandler(store, metrics=None), flat)
        with pytest.raises(KeyboardInterrupt):
            run(interrupted)
        # counted like a transient error: the scope is released, its counter kept
        kept.append((store.get(_scope()), store.get_retry_count(_scope())))
    assert kept[0] == kept[1] == (None, 1)


def test_run_and_execute_take_the_flat_path_without_a_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_flow(*args: Any) -> Any:
        raise AssertionError("the flow was built")

    monkeypatch.setattr(calls, "build_flow", no_flow)
    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    assert handler.execute(lambda: 1, operation=OP, tenant=TENANT, key="a") == 1
    assert handler.run(lambda: 2, operation=OP, tenant=TENANT, key="a").result == 1
    cached = IdempotencyHandler(MemoryStore(), metrics=None, cache=MemoryCache())
    with pytest.raises(AssertionError, match="the flow was built"):
        cached.run(lambda: 3, operation=OP, tenant=TENANT, key="a")
