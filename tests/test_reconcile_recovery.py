"""Recovery and ``on_stuck="reconcile"``: the recovery job never releases a crashed attempt
of an operation that reconciles (a release would make the next delivery a fresh claim that
runs the body without asking ``reconcile``); the next delivery's takeover asks it."""

from __future__ import annotations

from idempotent_tasks import IdempotencyHandler, MemoryStore, Reconciled, Status
from idempotent_tasks.testing import FakeClock, simulate_crash

SCOPE = {"operation": "orders.charge", "tenant": "acme", "key": "k-1"}


def test_recovery_leaves_a_reconciling_operations_crash_to_the_next_delivery() -> None:
    clock = FakeClock()
    handler = IdempotencyHandler(MemoryStore(), metrics=None, clock=clock, lease_timeout=30)
    asked: list[str] = []

    def reconcile(ctx: object) -> Reconciled:
        asked.append("asked")
        return Reconciled.done("found")

    handler.register_operation("orders.charge", on_stuck="reconcile", reconcile=reconcile)
    handler.register_operation("orders.email", on_stuck="retry")
    assert isinstance(simulate_crash(handler, **SCOPE), int)
    assert isinstance(simulate_crash(handler, **{**SCOPE, "operation": "orders.email"}), int)
    clock.advance(31)
    assert handler.recover_stuck_records() == 1  # only the email's crash was released
    record = handler.get_record(**SCOPE)
    assert record is not None and record.status is Status.PROCESSING
    outcome = handler.run(lambda: "ran again", **SCOPE)
    assert (outcome.kind, outcome.result, outcome.retry_count) == ("replayed", "found", 1)
    assert asked == ["asked"]
