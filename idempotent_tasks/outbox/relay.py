"""The relay: publishes staged rows, in order per parent scope, at least once.

What is guaranteed:

* **Never lost.**  A row is marked SENT only after its broker confirmed it (see
  ``publishers/_base.py``); a relay killed between the confirmation and the mark publishes it
  again (at-least-once: the receiver's idempotency, keyed by the staged key, makes that one
  execution).  A row the broker refuses is retried with exponential backoff and, after
  ``max_attempts``, marked POISONED: kept, reported (log ``outbox_message_poisoned``, metric
  ``idempotency_outbox_poisoned_total``) and left for the operator
  (``idempotent-tasks outbox list|retry|drop``).  Nothing is ever deleted but SENT rows older
  than ``ttl``.
* **In order per parent.**  A batch is published in rounds: round k hands every broker the
  k-th row of each parent scope (per kind) in the batch, all parents at once; a row that is
  not confirmed stops its parent's later rows for the rest of the batch, and a refused row
  holds them back until its retry.  Row n+1 a body staged for a broker is therefore handed to
  it only after row n was confirmed (or poisoned).  Across parents, and across brokers, there
  is no order.
* **One relay per kind at a time.**  Each kind (celery, dramatiq, kafka, rabbitmq) is served
  by the relay holding the store lease ``idempotency.outbox.<kind>``, renewed while it runs, so
  a fleet of workers may each start one: the others stand by.  A relay frozen past its lease
  may publish alongside its successor — duplicates, never losses (and the receivers dedupe).
* **Back-pressure.**  A broker that cannot be reached is not the rows' fault: their attempts
  are not counted, the relay stops taking that kind's rows and tries again after a backoff
  (``broker_backoff``), while the rows wait durably in the table; other kinds go on.

Wake-up: on PostgreSQL the relay ``LISTEN``s on ``<prefix>_outbox`` (every staging statement
notifies at its commit) and also polls every ``poll_interval`` seconds; elsewhere it polls.  A
full batch is followed by the next one at once.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._core.errors import ConfigurationError, IdempotencyError
from ._metrics import OutboxMetrics, outbox_metrics_for
from ._staging import notify_channel
from ._table import Outbox, OutboxRow
from ._wakeup import ListenWaiter, PollWaiter, Waiter
from .publishers import Publisher, PublishResult

if TYPE_CHECKING:
    from .._core.handler import IdempotencyHandler

LEASE_PREFIX = "idempotency.outbox."
DEFAULT_BATCH_SIZE = 1000
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_BACKOFF = (1.0, 300.0)
DEFAULT_BROKER_BACKOFF = (0.5, 30.0)
DEFAULT_LEASE_TTL = 60.0
_PENDING_EVERY = 5.0
_CLEANUP_EVERY = 60.0


@dataclass
class BatchReport:
    """What one batch did (``rows`` taken from the table)."""

    rows: int = 0
    published: int = 0
    rejected: int = 0
    poisoned: int = 0
    deferred: int = 0
    unavailable: int = 0
    kinds: tuple[str, ...] = ()
    #: ``drain`` stopped at its deadline while batches still made progress.
    more: bool = False

    def add(self, other: BatchReport) -> None:
        for name in ("rows", "published", "rejected", "poisoned", "deferred", "unavailable"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Settlement:
    sent: list[int] = field(default_factory=list)
    failed: list[tuple[OutboxRow, str, float | None]] = field(default_factory=list)
    lags: dict[str, list[float]] = field(default_factory=dict)


class OutboxRelay:
    """Publishes the rows of ``outbox`` through ``publishers`` (one per kind it serves).

    ``handler`` provides the store leases, the clock, the logger and the metrics' registry;
    ``ttl`` (default: the handler's) is how long SENT rows are kept.
    """

    def __init__(
        self,
        handler: IdempotencyHandler,
        outbox: Outbox,
        publishers: Iterable[Publisher],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        ttl: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_backoff: tuple[float, float] = DEFAULT_RETRY_BACKOFF,
        broker_backoff: tuple[float, float] = DEFAULT_BROKER_BACKOFF,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        listen: bool | None = None,
        owner: str | None = None,
    ) -> None:
        self.publishers: dict[str, Publisher] = {p.kind: p for p in publishers}
        if not self.publishers or batch_size < 1 or max_attempts < 1 or poll_interval <= 0:
            raise ConfigurationError(
                "OutboxRelay needs at least one publisher, batch_size >= 1, max_attempts >= 1 "
                "and poll_interval > 0"
            )
        self.handler, self.outbox = handler, outbox
        self.batch_size, self.poll_interval = batch_size, poll_interval
        self.ttl = float(ttl if ttl is not None else handler.defaults.ttl)
        self.max_attempts = max_attempts
        self.retry_backoff, self.broker_backoff = retry_backoff, broker_backoff
        self.lease_ttl = lease_ttl
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.metrics: OutboxMetrics = outbox_metrics_for(handler.metrics)
        self.log = handler.logger
        listen = outbox.dialect == "postgresql" if listen is None else listen
        self.waiter: Waiter = (
            ListenWaiter(outbox.engine, notify_channel(outbox.table_prefix), self.log)
            if listen else PollWaiter()
        )
        self._held: dict[str, float] = {}  # kind -> when its lease was last renewed
        self._blocked: dict[str, tuple[float, float]] = {}  # kind -> (until, delay)
        self._last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.totals = BatchReport()

    # -- leases --------------------------------------------------------------------------------
    def held_kinds(self) -> list[str]:
        """The kinds whose lease this relay holds now (renewing those that are due)."""
        now = self.handler.clock()
        for kind in self.publishers:
            renewed = self._held.get(kind)
            if renewed is not None and now - renewed < self.lease_ttl / 3:
                continue
            try:
                got = self.handler.try_lock(LEASE_PREFIX + kind, owner=self.owner,
                                            ttl=self.lease_ttl)
            except IdempotencyError as exc:
                self.log.error("outbox_lease_failed", kind=kind, error=exc.message)
                got = False
            if got:
                self._held[kind] = now
            elif self._held.pop(kind, None) is not None:
                self.log.warning("outbox_lease_lost", kind=kind, owner=self.owner)
        return sorted(self._held)

    def release(self) -> None:
        """Give the leases up (a stopping relay), so a standby takes over at once."""
        for kind in list(self._held):
            with contextlib.suppress(IdempotencyError):  # else the lease expires by itself
                self.handler.unlock(LEASE_PREFIX + kind, owner=self.owner)
        self._held.clear()

    # -- one batch -----------------------------------------------------------------------------
    def run_once(self) -> BatchReport:
        """Take one batch, publish it, record the results.  Store failures are logged and
        answered with an empty report (the rows wait; nothing is lost)."""
        now = self.handler.clock()
        kinds = [k for k in self.held_kinds() if self._blocked.get(k, (0.0, 0.0))[0] <= now]
        try:
            self._housekeeping(now)
            rows = self.outbox.due(now=now, limit=self.batch_size, kinds=kinds)
        except IdempotencyError as exc:
            self.log.error("outbox_relay_store_failed", error=exc.message)
            return BatchReport(kinds=tuple(kinds))
        report = BatchReport(rows=len(rows), kinds=tuple(kinds))
        if not rows:
            return report
        settlement = _Settlement()
        stopped: set[tuple[str, str, str, str]] = set()  # streams with a row not confirmed
        down: set[str] = set()  # kinds whose broker could not be reached in this batch
        for batch_round in _rounds(rows):
            left = [r for r in batch_round if r.stream not in stopped and r.kind not in down]
            for kind, batch in _by_kind(left).items():
                results = self.publishers[kind].publish(batch)
                self._account(kind, batch, results, settlement, report)
                stopped.update(r.stream for r, res in zip(batch, results, strict=True)
                               if res.state != "sent")
                if any(res.state == "unavailable" for res in results):
                    down.add(kind)
        self._settle(settlement)
        self.totals.add(report)
        return report

    def _account(self, kind: str, rows: Sequence[OutboxRow], results: Sequence[PublishResult],
                 settlement: _Settlement, report: BatchReport) -> None:
        now = self.handler.clock()
        down = [r for r in results if r.state == "unavailable"]
        for row, result in zip(rows, results, strict=True):
            if result.state == "sent":
                settlement.sent.append(row.id)
                settlement.lags.setdefault(kind, []).append(now - row.created_at)
                report.published += 1
            elif result.state == "rejected":
                self._rejected(kind, row, result.error or "rejected", now, settlement, report)
            elif result.state == "deferred":
                report.deferred += 1
        report.unavailable += len(down)
        if down:
            self._back_off(kind, down[0].error or "unavailable", now, len(down))
        else:
            self._blocked.pop(kind, None)

    def _rejected(self, kind: str, row: OutboxRow, error: str, now: float,
                  settlement: _Settlement, report: BatchReport) -> None:
        attempts = row.attempts + 1
        self.metrics.publish_failed(kind, "rejected")
        if attempts >= self.max_attempts:
            settlement.failed.append((row, error, None))
            report.poisoned += 1
            self.metrics.poisoned(kind)
            self.log.warning("outbox_message_poisoned", id=row.id, kind=kind,
                             destination=row.destination, attempts=attempts, error=error)
            return
        initial, cap = self.retry_backoff
        delay = min(cap, initial * 2 ** (attempts - 1)) * random.uniform(0.8, 1.2)
        settlement.failed.append((row, error, now + delay))
        report.rejected += 1
        self.log.info("outbox_publish_rejected", id=row.id, kind=kind,
                      destination=row.destination, attempts=attempts, retry_in=round(delay, 3),
                      error=error)

    def _back_off(self, kind: str, error: str, now: float, count: int) -> None:
        initial, cap = self.broker_backoff
        previous = self._blocked.get(kind, (0.0, 0.0))[1]
        delay = min(cap, previous * 2) if previous else initial
        self._blocked[kind] = (now + delay, delay)
        self.metrics.publish_failed(kind, "unavailable", count)
        self.log.warning("outbox_broker_unavailable", kind=kind, retry_in=delay, error=error)

    def _settle(self, s: _Settlement) -> None:
        now = self.handler.clock()
        try:
            self.outbox.settle(sent=s.sent, failed=s.failed, now=now, expires_at=now + self.ttl)
        except IdempotencyError as exc:  # published but not marked: published again later
            self.log.error("outbox_settle_failed", error=exc.message, published=len(s.sent))
            return
        for kind, lags in s.lags.items():
            self.metrics.published(kind, lags)

    def _housekeeping(self, now: float) -> None:
        """The pending gauge every few seconds; clean-up of expired SENT rows every minute."""
        if now - self._last.get("pending", 0.0) >= _PENDING_EVERY:
            self._last["pending"] = now
            self.metrics.pending(self.outbox.pending_count())
        if now - self._last.get("cleanup", 0.0) >= _CLEANUP_EVERY:
            self._last["cleanup"] = now
            removed = self.outbox.cleanup(now=now)
            if removed:
                self.log.info("outbox_cleaned", rows=removed)

    # -- running -------------------------------------------------------------------------------
    def drain(self, *, max_seconds: float | None = None) -> BatchReport:
        """Batches until one settles nothing (everything due is out, or waits for a backoff
        or a broker), or ``max_seconds`` passed; the total."""
        total = BatchReport()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while True:
            report = self.run_once()
            total.add(report)
            total.kinds = report.kinds
            if report.published + report.rejected + report.poisoned == 0:
                return total
            if deadline is not None and time.monotonic() >= deadline:
                total.more = True
                return total

    def run(self, stop: threading.Event | None = None) -> None:
        """Publish until ``stop`` (or :meth:`stop`) is set; leases are given up at the end."""
        stop = stop or self._stop
        try:
            while not stop.is_set() and not self._stop.is_set():
                if not self.drain(max_seconds=self.poll_interval).more:
                    self.waiter.wait(self._pause())
        finally:
            self.release()

    def _pause(self) -> float:
        """Until the next poll, or sooner when a blocked broker's backoff ends; standing by
        (no lease held) re-checks the leases at the same pace."""
        now = self.handler.clock()
        ends = [until - now for until, _ in self._blocked.values() if until > now]
        return max(0.01, min([self.poll_interval, *ends]))

    def start(self) -> None:
        """Run in a daemon thread (a worker's in-process relay)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="idempotent-tasks-outbox-relay",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the thread, give the leases up, close the publishers and the listener."""
        self._stop.set()
        self.waiter.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        self.release()
        self.waiter.close()
        for publisher in self.publishers.values():
            try:
                publisher.close()
            except Exception as exc:  # closing must not hide the stop
                self.log.warning("outbox_publisher_close_failed", kind=publisher.kind,
                                 error=repr(exc))


def _rounds(rows: Sequence[OutboxRow]) -> list[list[OutboxRow]]:
    """Round k: the k-th row of every stream (parent scope and kind), in id order."""
    seen: dict[tuple[str, str, str, str], int] = {}
    rounds: list[list[OutboxRow]] = []
    for row in rows:
        k = seen.get(row.stream, 0)
        seen[row.stream] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(row)
    return rounds


def _by_kind(rows: Sequence[OutboxRow]) -> dict[str, list[OutboxRow]]:
    grouped: dict[str, list[OutboxRow]] = {}
    for row in rows:
        grouped.setdefault(row.kind, []).append(row)
    return grouped


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_POLL_INTERVAL",
    "LEASE_PREFIX",
    "BatchReport",
    "OutboxRelay",
]
