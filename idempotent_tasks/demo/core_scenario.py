"""The core handler's guarantees, shown on a real store (the demo's first section).

Each scenario sends deliveries through :class:`~idempotent_tasks.IdempotencyHandler` the way a
broker would (duplicates, concurrent duplicates, failures, a crashed or stalled worker) and
checks that what happened is what docs/guarantees.md promises.  Races are forced with barriers and
events, never hoped for with sleeps; the only waits are for a short lease or TTL to run out,
which is the very thing being shown.

A crashed worker is shown as what it leaves behind: a claimed scope (PROCESSING, lease
running) whose outcome is never written.  The framework sections (Celery, Dramatiq) kill real
worker processes.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core.errors import IdempotencyError, idempotency_error_status
from .._core.handler import IdempotencyHandler
from .._core.metrics import Metrics
from .._core.records import Status
from ..stores.base import Store
from ..stores.urls import store_from_url
from ..testing import simulate_crash
from ._report import ScenarioLine

INTEGRATION = "core"
OPERATION = "demo.core.charge"
TENANT = "demo-acme"
OTHER_TENANT = "demo-globex"
SHORT = 0.3  # seconds: the short leases and TTLs that the crash and expiry scenarios wait out
CONCURRENT = 8
_WAIT = 10.0  # upper bound for every barrier/event wait: a hung scenario fails, never hangs

Outcome = tuple[str, Any]  # ("ok", result) | (error code, error) | ("raised", exception)


class CardDeclined(Exception):
    """A permanent failure: retrying cannot help."""


class GatewayTimeout(Exception):
    """A transient failure: a later attempt may succeed."""


def new_key() -> str:
    return str(uuid.uuid4())


class CoreDemo:
    """One handler on one store; counts how often each body really ran."""

    def __init__(self, store: Store, metrics: Metrics | None) -> None:
        self.store = store
        self.handler = IdempotencyHandler(
            store, metrics=metrics, ttl=3600.0, lease_timeout=30.0, max_retries=3
        )
        self.runs: Counter[str] = Counter()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- helpers
    def body(self, label: str, result: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                self.runs[label] += 1
            return result()

        return run

    def failing(self, label: str, exc: Callable[[], BaseException]) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                self.runs[label] += 1
            raise exc()

        return run

    def deliver(
        self, fn: Callable[[], Any], key: str, payload: Any = None, *, tenant: str = TENANT,
        **options: Any,
    ) -> Outcome:
        """One delivery; expected refusals come back as values, like a worker sees them."""
        try:
            return "ok", self.handler.execute(
                fn, operation=OPERATION, tenant=tenant, key=key, payload=payload,
                permanent=(CardDeclined,), **options,
            )
        except IdempotencyError as exc:
            return exc.code.value, exc
        except Exception as exc:
            return "raised", exc

    def crashed_claim(self, key: str, payload: Any) -> float:
        """A worker claims the scope and dies before writing an outcome; returns when its
        lease runs out."""
        simulate_crash(self.handler, operation=OPERATION, tenant=TENANT, key=key,
                       payload=payload, lease_timeout=SHORT)
        return self.handler.clock() + SHORT

    def status(self, key: str, tenant: str = TENANT) -> tuple[str | None, int]:
        record = self.handler.get_record(operation=OPERATION, tenant=tenant, key=key)
        if record is None:
            return None, self.handler.retry_count(operation=OPERATION, tenant=tenant, key=key)
        return record.status.value, record.retry_count

    def stored(self, key: str) -> bool:
        """Whether the store still holds the scope's record, expired or not (``get_record``
        counts an expired record as absent; the operators' listing shows it)."""
        listed = self.handler.list_records(operation=OPERATION, tenant=TENANT, limit=10_000)
        return any(record.key == key for record in listed)

    # ---------------------------------------------------------------- scenarios
    def duplicates(self) -> ScenarioLine:
        key, payload = new_key(), {"order": "A-1001", "amount_cents": 2500}
        body = self.body("duplicates", lambda: {"charge_id": new_key(), "amount_cents": 2500})
        outcomes = [self.deliver(body, key, payload) for _ in range(3)]
        results = [r for code, r in outcomes if code == "ok"]
        ok = self.runs["duplicates"] == 1 and len(results) == 3 and all(
            r == results[0] for r in results
        )
        return ScenarioLine(
            INTEGRATION, "sequential duplicates", 3, self.runs["duplicates"],
            "ran once, replayed 2x with the identical result", ok,
        )

    def concurrent(self) -> ScenarioLine:
        key, payload = new_key(), {"order": "A-1002"}
        barrier = threading.Barrier(CONCURRENT)
        refused = threading.Semaphore(0)
        outcomes: list[Outcome] = []

        def winner_body() -> Any:
            with self._lock:
                self.runs["concurrent"] += 1
            for _ in range(CONCURRENT - 1):  # hold the scope until every other delivery answered
                refused.acquire(timeout=_WAIT)
            return {"charged": True}

        def worker() -> None:
            barrier.wait(timeout=_WAIT)
            outcome = self.deliver(winner_body, key, payload)
            with self._lock:
                outcomes.append(outcome)
            if outcome[0] != "ok":
                refused.release()

        threads = [threading.Thread(target=worker) for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(_WAIT * 2)
        codes = Counter(code for code, _ in outcomes)
        replay = self.deliver(winner_body, key, payload)
        ok = (
            self.runs["concurrent"] == 1
            and codes == Counter({"ok": 1, "REQUEST_IN_PROGRESS": CONCURRENT - 1})
            and replay == ("ok", {"charged": True})
        )
        return ScenarioLine(
            INTEGRATION, "concurrent duplicates", CONCURRENT + 1, self.runs["concurrent"],
            f"ran once; {codes['REQUEST_IN_PROGRESS']} got 409 REQUEST_IN_PROGRESS, "
            "then 1 replay", ok, {"codes": dict(codes)},
        )

    def tenants(self) -> ScenarioLine:
        key, payload = new_key(), {"order": "shared-looking"}
        got: dict[str, list[Outcome]] = {}
        for tenant in (TENANT, OTHER_TENANT, TENANT, OTHER_TENANT):
            body = self.body("tenants", receipt_for(tenant))
            got.setdefault(tenant, []).append(self.deliver(body, key, payload, tenant=tenant))
        ok = self.runs["tenants"] == 2 and all(
            outcome == ("ok", {"receipt_for": tenant})
            for tenant, outcomes in got.items() for outcome in outcomes
        )
        return ScenarioLine(
            INTEGRATION, "tenant isolation (same key)", 4, self.runs["tenants"],
            "one run per tenant; replays return that tenant's result", ok,
        )

    def key_reuse(self) -> ScenarioLine:
        key = new_key()
        body = self.body("reuse", lambda: {"amount_cents": 100})
        first = self.deliver(body, key, {"amount_cents": 100})
        second = self.deliver(body, key, {"amount_cents": 9900})
        err = second[1]
        status = idempotency_error_status(err) if isinstance(err, IdempotencyError) else None
        ok = (
            first[0] == "ok" and second[0] == "KEY_REUSED_WITH_DIFFERENT_REQUEST"
            and status == 409 and self.runs["reuse"] == 1
        )
        return ScenarioLine(
            INTEGRATION, "key reused with another payload", 2, self.runs["reuse"],
            f"{status} {second[0]}; not run again", ok,
        )

    def permanent(self) -> ScenarioLine:
        key, payload = new_key(), {"card": "declined"}
        body = self.failing("permanent", lambda: CardDeclined("card declined"))
        first = self.deliver(body, key, payload)
        second = self.deliver(body, key, payload)
        status, _ = self.status(key)
        ok = (
            first[0] == "raised" and isinstance(first[1], CardDeclined)
            and second[0] == "REQUEST_FAILED" and status == "FAILED"
            and self.runs["permanent"] == 1
        )
        return ScenarioLine(
            INTEGRATION, "permanent failure", 2, self.runs["permanent"],
            "poisoned at once; redelivery refused 409 REQUEST_FAILED", ok,
        )

    def transient(self) -> ScenarioLine:
        key, payload = new_key(), {"gateway": "flaky"}
        body = self.failing("transient", lambda: GatewayTimeout("gateway timed out"))
        outcomes = [self.deliver(body, key, payload) for _ in range(4)]
        status, count = self.status(key)
        ok = (
            [code for code, _ in outcomes] == ["raised", "raised", "raised", "REQUEST_FAILED"]
            and status == "FAILED" and count == 3 and self.runs["transient"] == 3
        )
        return ScenarioLine(
            INTEGRATION, "transient failures", 4, self.runs["transient"],
            f"failed {count}x (transient): poisoned at max_retries=3; 4th refused", ok,
        )

    def transient_then_success(self) -> ScenarioLine:
        key, payload = new_key(), {"gateway": "recovers"}
        attempts = iter([GatewayTimeout("first try times out"), None])

        def body() -> Any:
            with self._lock:
                self.runs["flaky"] += 1
            exc = next(attempts)
            if exc is not None:
                raise exc
            return {"charged": True}

        outcomes = [self.deliver(body, key, payload) for _ in range(3)]
        status, count = self.status(key)
        ok = (
            [code for code, _ in outcomes] == ["raised", "ok", "ok"]
            and status == "SUCCESS" and count == 1 and self.runs["flaky"] == 2
        )
        return ScenarioLine(
            INTEGRATION, "transient failure, then success", 3, self.runs["flaky"],
            "failed once (counted), then succeeded; then replayed", ok,
        )

    def crash_recovered(self) -> ScenarioLine:
        key, payload = new_key(), {"order": "A-1003"}
        wait_until(self.crashed_claim(key, payload))
        recovered = self.handler.recover_stuck_records(limit=1000)
        after_recovery = self.status(key)
        outcome = self.deliver(self.body("recovered", lambda: {"charged": True}), key, payload)
        ok = (
            recovered >= 1 and after_recovery == (None, 1) and outcome[0] == "ok"
            and self.status(key) == ("SUCCESS", 1) and self.runs["recovered"] == 1
        )
        return ScenarioLine(
            INTEGRATION, "crashed worker, maintenance", 2, self.runs["recovered"],
            "the 1st worker died before the body; maintenance freed the "
            "scope (attempt counted); the redelivery ran it", ok, {"recovered": recovered},
        )

    def crash_taken_over(self) -> ScenarioLine:
        key, payload = new_key(), {"order": "A-1004"}
        wait_until(self.crashed_claim(key, payload))
        outcome = self.deliver(self.body("takeover", lambda: {"charged": True}), key, payload)
        ok = outcome[0] == "ok" and self.status(key) == ("SUCCESS", 1) and (
            self.runs["takeover"] == 1
        )
        return ScenarioLine(
            INTEGRATION, "crashed worker, redelivery", 2, self.runs["takeover"],
            "the 1st worker died before the body; after its lease the "
            "redelivery took over (new fencing token)", ok,
        )

    def stalled(self) -> ScenarioLine:
        """A worker stalls past its lease: a redelivery takes over and wins; the stale
        owner's late write is refused (``lease_lost``) and the stored result stays the new
        owner's."""
        key, payload = new_key(), {"order": "A-1005"}
        started, release = threading.Event(), threading.Event()
        stale: list[Outcome] = []

        def slow() -> Any:
            with self._lock:
                self.runs["stalled"] += 1
            started.set()
            release.wait(_WAIT)
            return {"by": "stalled worker"}

        thread = threading.Thread(
            target=lambda: stale.append(self.deliver(slow, key, payload, lease_timeout=SHORT))
        )
        thread.start()
        started.wait(_WAIT)
        wait_until(self.handler.clock() + SHORT)
        fresh = self.deliver(self.body("stalled", lambda: {"by": "new owner"}), key, payload)
        release.set()
        thread.join(_WAIT)
        record = self.handler.get_record(operation=OPERATION, tenant=TENANT, key=key)
        ok = (
            fresh == ("ok", {"by": "new owner"}) and stale == [("ok", {"by": "stalled worker"})]
            and record is not None and record.response == {"by": "new owner"}
            and self.runs["stalled"] == 2
        )
        return ScenarioLine(
            INTEGRATION, "stalled worker loses its lease", 2, self.runs["stalled"],
            "ran 2x: the 1st stalled past its lease and a redelivery took "
            "over; the stale result was refused (lease_lost)", ok,
        )

    def expiry(self) -> ScenarioLine:
        key, payload = new_key(), {"report": "daily"}
        body = self.body("expiry", lambda: {"generated": True})
        first = self.deliver(body, key, payload, ttl=SHORT)
        wait_until(self.handler.clock() + SHORT)
        purged = self.handler.cleanup_expired_records(limit=1000)
        gone = not self.stored(key)
        second = self.deliver(body, key, payload)
        ok = first[0] == "ok" and purged >= 1 and gone and second[0] == "ok" and (
            self.runs["expiry"] == 2
        )
        return ScenarioLine(
            INTEGRATION, "record expired", 2, self.runs["expiry"],
            "record purged after its ttl; the same key then ran again", ok,
            {"purged": purged},
        )

    def unpoison(self) -> ScenarioLine:
        key, payload = new_key(), {"card": "fixed later"}
        first = self.deliver(self.failing("unpoison", lambda: CardDeclined("no")), key, payload)
        old = self.handler.unpoison(operation=OPERATION, tenant=TENANT, key=key, actor="demo")
        second = self.deliver(self.body("unpoison", lambda: {"charged": True}), key, payload)
        ok = (
            first[0] == "raised" and old.status is Status.FAILED and second[0] == "ok"
            and self.runs["unpoison"] == 2
        )
        return ScenarioLine(
            INTEGRATION, "operator unpoison", 2, self.runs["unpoison"],
            "poisoned; an operator unpoisoned it (audited); then it ran", ok,
        )

    def all(self) -> list[Callable[[], ScenarioLine]]:
        return [
            self.duplicates, self.concurrent, self.tenants, self.key_reuse, self.permanent,
            self.transient, self.transient_then_success, self.crash_recovered,
            self.crash_taken_over, self.stalled, self.expiry, self.unpoison,
        ]


def receipt_for(tenant: str) -> Callable[[], Any]:
    return lambda: {"receipt_for": tenant}


def wait_until(deadline: float) -> None:
    """Let wall-clock time pass ``deadline`` (a lease or TTL end from the handler's clock)."""
    remaining = deadline - time.time()
    if remaining > 0:
        time.sleep(remaining + 0.02)


def run_scenario(
    store_url: str, workdir: Path | str | None = None, *, metrics: Metrics | None = None,
    prefix: str | None = None,
) -> list[ScenarioLine]:
    """Run every core scenario on the store at ``store_url``; one line per scenario.

    ``workdir`` is accepted for symmetry with the framework scenarios (the core needs no
    files); ``metrics``: where the handler records (none when omitted); ``prefix``: the
    store's table / key prefix.  A scenario that raises becomes a failed line, never an
    exception.
    """
    del workdir
    store = store_from_url(store_url, prefix=prefix)
    store.create_schema()
    demo = CoreDemo(store, metrics)
    lines = []
    try:
        for scenario in demo.all():
            try:
                lines.append(scenario())
            except Exception as exc:
                name = scenario.__name__.replace("_", " ")
                lines.append(ScenarioLine(
                    INTEGRATION, name, 0, 0, f"crashed: {type(exc).__name__}: {exc}", False
                ))
    finally:
        demo.handler.close()
        store.close()
    return lines
