"""``transactional=True`` on ``DjangoStore``: the body's ORM writes commit with SUCCESS, in
``transaction.atomic(using=…)``, on PostgreSQL and SQLite."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connections, transaction

from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler, Status
from idempotent_tasks.django import DjangoStore
from idempotent_tasks.enqueue import enqueue_once
from idempotent_tasks.testing import FakeClock

from .._wait import budget
from .conftest import on_databases
from .project.orders.models import Charge


class Flaky(Exception):
    pass


def handler_on(alias: str, **options: Any) -> IdempotencyHandler:
    return IdempotencyHandler(DjangoStore(using=alias), metrics=None, **options)


def charges() -> list[tuple[str, int]]:
    return sorted(Charge.objects.values_list("order_id", "amount"))


def test_orm_writes_and_success_commit_together_once(alias: str) -> None:
    h = handler_on(alias)
    seen: list[Any] = []

    def body(conn: Any) -> dict[str, Any]:
        seen.append(conn)
        row = Charge.objects.create(order_id="o1", amount=5)
        return {"charge": row.pk}

    first = h.execute_in_transaction(body, operation="pay", tenant="t", key="k1")
    again = h.execute_in_transaction(body, operation="pay", tenant="t", key="k1")
    assert first == again and len(seen) == 1
    assert seen[0] is connections[alias]  # fn(connection): Django's own connection
    assert charges() == [("o1", 5)]
    record = h.get_record(operation="pay", tenant="t", key="k1")
    assert record is not None and record.status is Status.SUCCESS and record.response == first


def test_the_claim_commits_before_the_body_runs(alias: str) -> None:
    """Another connection sees PROCESSING while the body is still inside its transaction,
    so a concurrent duplicate is refused instead of running."""
    h = handler_on(alias)
    seen: list[Any] = []

    def look() -> None:
        try:
            seen.append(h.get_record(operation="pay", tenant="t", key="k2"))
            if alias != "sqlite":  # SQLite: the body holds the write lock, a claim would wait
                seen.append(h.run(lambda: "dup", operation="pay", tenant="t", key="k2").kind)
        finally:
            connections.close_all()

    def body(conn: Any) -> str:
        Charge.objects.create(order_id="o2", amount=1)
        other = threading.Thread(target=look)
        other.start()
        other.join(budget(20))
        return "done"

    assert h.execute_in_transaction(body, operation="pay", tenant="t", key="k2") == "done"
    assert seen[0] is not None and seen[0].status is Status.PROCESSING
    assert seen[1:] == ([] if alias == "sqlite" else ["in_progress"])


def test_a_body_that_raises_leaves_no_rows_and_its_failure_counted(alias: str) -> None:
    h = handler_on(alias, max_retries=3)

    def body(conn: Any) -> None:
        Charge.objects.create(order_id="o3", amount=1)
        raise Flaky("after the write")

    for attempt in (1, 2):
        outcome = h.run(body, operation="pay", tenant="t", key="k3", transactional=True)
        assert outcome.kind == "failed" and outcome.error == "Flaky"
        assert h.retry_count(operation="pay", tenant="t", key="k3") == attempt  # not rolled back
    assert charges() == []
    assert h.get_record(operation="pay", tenant="t", key="k3") is None  # released
    third = h.run(body, operation="pay", tenant="t", key="k3", transactional=True)
    assert third.kind == "poisoned" and charges() == []


def test_a_permanent_failure_rolls_back_and_poisons(alias: str) -> None:
    h = handler_on(alias)

    def body(conn: Any) -> None:
        Charge.objects.create(order_id="o4", amount=1)
        raise ValueError("card declined")

    outcome = h.run(body, operation="pay", tenant="t", key="k4", transactional=True,
                    permanent=(ValueError,))
    assert outcome.kind == "poisoned" and charges() == []
    record = h.get_record(operation="pay", tenant="t", key="k4")
    assert record is not None and record.status is Status.FAILED


def test_nested_atomic_blocks_are_savepoints_of_the_body(alias: str) -> None:
    h = handler_on(alias)

    def body(conn: Any) -> str:
        with transaction.atomic(using=alias):
            Charge.objects.create(order_id="kept", amount=1)
        try:
            with transaction.atomic(using=alias):
                Charge.objects.create(order_id="undone", amount=1)
                raise Flaky("inner")
        except Flaky:
            pass
        return "ok"

    assert h.execute_in_transaction(body, operation="pay", tenant="t", key="k5") == "ok"
    assert charges() == [("kept", 1)]


def test_a_body_that_commits_itself_is_a_configuration_error_that_poisons(alias: str) -> None:
    h = handler_on(alias)

    def rogue(conn: Any) -> str:
        Charge.objects.create(order_id="rogue", amount=1)
        conn.connection.commit()  # behind Django's back: the shared transaction ends here
        return "rogue"

    outcome = h.run(rogue, operation="pay", tenant="t", key="k6", transactional=True)
    assert outcome.kind == "poisoned" and outcome.error_code == ErrorCode.CONFIGURATION_ERROR
    record = h.get_record(operation="pay", tenant="t", key="k6")
    assert record is not None and record.status is Status.FAILED


def test_a_body_that_breaks_the_atomic_block_is_a_configuration_error(alias: str) -> None:
    """A database error caught inside the block without a savepoint around it, after which
    the block is marked for rollback (``set_rollback(True)``, as Django asks): nothing of the
    body may commit, and the scope is poisoned."""
    h = handler_on(alias)
    existing = Charge.objects.create(order_id="existing", amount=0)

    def careless(conn: Any) -> str:
        Charge.objects.create(order_id="o7", amount=1)
        try:
            Charge.objects.create(id=existing.pk, order_id="clash", amount=1)
        except IntegrityError:
            transaction.set_rollback(True, using=alias)
        return "careless"

    outcome = h.run(careless, operation="pay", tenant="t", key="k7", transactional=True)
    assert outcome.kind == "poisoned" and outcome.error_code == ErrorCode.CONFIGURATION_ERROR
    assert charges() == [("existing", 0)]


def test_transaction_commit_inside_the_body_is_refused_by_django(alias: str) -> None:
    h = handler_on(alias)

    def body(conn: Any) -> None:
        Charge.objects.create(order_id="o8", amount=1)
        transaction.commit(using=alias)

    outcome = h.run(body, operation="pay", tenant="t", key="k8", transactional=True)
    assert outcome.kind == "failed" and outcome.error == "TransactionManagementError"
    assert charges() == []


def test_an_unstorable_result_rolls_back_and_poisons(alias: str) -> None:
    h = handler_on(alias)

    def body(conn: Any) -> object:
        Charge.objects.create(order_id="o9", amount=1)
        return object()

    with pytest.raises(IdempotencyError) as caught:
        h.execute_in_transaction(body, operation="pay", tenant="t", key="k9")
    assert caught.value.code == ErrorCode.RESPONSE_NOT_SERIALIZABLE and charges() == []


def test_inside_a_callers_atomic_block_nothing_runs(alias: str) -> None:
    h = handler_on(alias)
    ran: list[str] = []
    with transaction.atomic(using=alias):
        outcome = h.run(lambda conn: ran.append("x"), operation="pay", tenant="t", key="k10",
                        transactional=True)
        plain = h.run(lambda: ran.append("y"), operation="pay", tenant="t", key="k11")
    assert ran == []
    assert outcome.error_code == ErrorCode.CONFIGURATION_ERROR
    assert plain.error_code == ErrorCode.CONFIGURATION_ERROR
    assert h.get_record(operation="pay", tenant="t", key="k10") is None


class RecordingTask:
    """A Celery-shaped task that records what was published, and when."""

    name = "orders.receipt"

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def apply_async(self, args: Any, kwargs: Any, **options: Any) -> str:
        self.published.append({"args": args, **options})
        return "sent"

    def AsyncResult(self, task_id: str) -> str:
        return f"pending:{task_id}"


def test_enqueue_once_in_a_transactional_body_publishes_on_commit(alias: str) -> None:
    h = handler_on(alias)
    task = RecordingTask()
    during: list[int] = []

    def body(conn: Any) -> str:
        Charge.objects.create(order_id="o12", amount=1)
        returned = enqueue_once(task, "o12")
        during.append(len(task.published))
        return str(returned)

    result = h.execute_in_transaction(body, operation="pay", tenant="t", key="k12")
    assert during == [0] and len(task.published) == 1  # published only after the commit
    assert result == f"pending:{task.published[0]['task_id']}"
    assert task.published[0]["headers"]["idempotency_tenant"] == "t"

    def rolled_back(conn: Any) -> None:
        enqueue_once(task, "o13")
        raise Flaky("rolled back")

    h.run(rolled_back, operation="pay", tenant="t", key="k13", transactional=True)
    assert len(task.published) == 1  # never published: its transaction rolled back
    outside = h.execute(lambda: enqueue_once(task, "o14"), operation="pay", tenant="t",
                        key="k14")
    assert outside == "sent" and len(task.published) == 2  # no transaction: at once


@pytest.mark.parametrize("alias", on_databases("default"), indirect=True)
def test_a_stale_owner_is_rolled_back_and_answers_as_a_duplicate(alias: str) -> None:
    """PostgreSQL only: on SQLite the body holds the single write lock, so no takeover can
    happen while it is inside its transaction."""
    clock = FakeClock(time.time())
    h = handler_on(alias, clock=clock, lease_timeout=30)
    started, release = threading.Event(), threading.Event()
    out: list[Any] = []

    def stale(conn: Any) -> str:
        Charge.objects.create(order_id="stale", amount=1)
        started.set()
        assert release.wait(budget(20))
        return "stale"

    def run_stale() -> None:
        try:
            out.append(h.execute_in_transaction(stale, operation="pay", tenant="t", key="k"))
        finally:
            connections.close_all()

    t = threading.Thread(target=run_stale)
    try:
        t.start()
        assert started.wait(budget(20))
        clock.advance(31)  # the stale owner is paused past its lease
        fresh = h.execute_in_transaction(
            lambda conn: Charge.objects.create(order_id="fresh", amount=1) and "fresh",
            operation="pay", tenant="t", key="k",
        )
        assert fresh == "fresh"
        release.set()
        t.join(budget(20))
        assert out == ["fresh"]  # the winner's result, not its own
        assert charges() == [("fresh", 1)]
        record = h.get_record(operation="pay", tenant="t", key="k")
        assert record is not None and record.retry_count == 1
    finally:
        release.set()
        t.join(budget(20))


@pytest.mark.parametrize("alias", on_databases("default"), indirect=True)
def test_a_swallowed_error_that_aborted_the_transaction_poisons(alias: str) -> None:
    """PostgreSQL aborts the transaction on any error: a body that swallows one and returns
    cannot commit anything, and the scope is poisoned."""
    h = handler_on(alias)
    existing = Charge.objects.create(order_id="existing", amount=0)

    def careless(conn: Any) -> str:
        Charge.objects.create(order_id="o16", amount=1)
        with contextlib.suppress(IntegrityError):
            Charge.objects.create(id=existing.pk, order_id="clash", amount=1)
        return "careless"

    outcome = h.run(careless, operation="pay", tenant="t", key="k16", transactional=True)
    assert outcome.kind == "poisoned" and outcome.error_code == ErrorCode.CONFIGURATION_ERROR
    assert charges() == [("existing", 0)]


def test_a_database_error_in_the_body_is_the_bodys_failure(alias: str) -> None:
    h = handler_on(alias)

    def body(conn: Any) -> None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    outcome = h.run(body, operation="pay", tenant="t", key="k15", transactional=True)
    assert outcome.kind == "failed" and outcome.exception is not None
    assert isinstance(outcome.exception, DatabaseError)
    assert h.retry_count(operation="pay", tenant="t", key="k15") == 1
