"""DynamoDBStore's maintenance and operator primitives: everything that reads the
``status-time`` index (recovery, cleanup, stats) or scans (``list_records``), plus the
maintenance leases and the operator's deletes.  None of it runs on the hot path."""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ..._core.records import Scope, Status, StoredRecord
from ._items import GC, INDEX, TOMBSTONE_REMOVE, gc_at, is_record, n, s, scoped_record
from ._plumbing import DynamoDBPlumbing, Refused

_BATCH_GET: Final = 100  # BatchGetItem's limit
_LOCK_FREE: Final = "attribute_not_exists(pk) OR ow = :ow OR lx <= :now"


class DynamoDBMaintenance(DynamoDBPlumbing):
    """Recovery, cleanup, operators' views and leases (see the package docstring)."""

    # -- the index ------------------------------------------------------------------------------
    def _query(self, partition: str, condition: str, values: dict[str, Any],
               page: int, filter_: str | None = None) -> Iterator[dict[str, Any]]:
        """Items of one index partition in sort-key order, page by page (lazily)."""
        request: dict[str, Any] = {
            "TableName": self.table_name, "IndexName": INDEX,
            "KeyConditionExpression": "gp = :gp" + condition,
            "ExpressionAttributeValues": {":gp": s(partition), **values},
            "ScanIndexForward": True, "Limit": max(1, page),
        }
        if filter_:
            request["FilterExpression"] = filter_
        while True:
            answer = self.client.query(**request)
            yield from answer.get("Items", [])
            if "LastEvaluatedKey" not in answer:
                return
            request["ExclusiveStartKey"] = answer["LastEvaluatedKey"]

    def _ordered(self, tag: str, condition: str, values: dict[str, Any], page: int,
                 filter_: str | None = None) -> Iterator[dict[str, Any]]:
        """Items of every shard of ``tag`` in (sort key, scope) order, lazily: the shards'
        pages merged by sort key, and items with the same sort key ordered by their scope —
        so which of several equal candidates a limit keeps never depends on digests."""
        streams = [self._query(p, condition, values, page, filter_)
                   for p in self._keys.partitions(tag)]
        merged = heapq.merge(*streams, key=_sort_key)
        for _, tied in itertools.groupby(merged, key=_sort_key):
            yield from sorted(tied, key=lambda item: tuple(_scope(item)))

    def _oldest(self, tag: str, condition: str, values: dict[str, Any], limit: int,
                filter_: str | None = None) -> list[dict[str, Any]]:
        """The first ``limit`` items of :meth:`_ordered`."""
        return self._take(self._ordered(tag, condition, values, limit, filter_), limit)

    @staticmethod
    def _take(items: Iterator[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        return [item for _, item in zip(range(limit), items, strict=False)]

    # -- recovery -------------------------------------------------------------------------------
    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        """One Query per index shard (PROCESSING, oldest ``updated_at`` first, live leases
        filtered out), then the candidates re-read with strongly consistent reads (the index
        is eventually consistent)."""
        if limit <= 0:
            return []
        condition, values = "", {":now": n(now)}
        if heartbeat_before is not None:
            condition, values[":hb"] = " AND gs < :hb", n(heartbeat_before)
        expired = "attribute_not_exists(le) OR le <= :now"

        def run(_: Any) -> list[StoredRecord]:
            candidates = self._oldest("P", condition, values, limit, expired)
            fresh = self._reread([scoped_record(item).scope for item in candidates])
            stuck = [
                r for r in fresh
                if r.status is Status.PROCESSING
                and (r.lease_expires_at is None or r.lease_expires_at <= now)
                and (heartbeat_before is None or r.updated_at < heartbeat_before)
            ]
            return sorted(stuck, key=lambda r: (r.updated_at, *r.scope))

        return self._call("find_stuck", run)

    def _reread(self, scopes: list[Scope]) -> list[StoredRecord]:
        """The current records of ``scopes`` (BatchGetItem, strongly consistent)."""
        by_key = {self._keys.record(self._keys.digest(sc))["pk"]["S"]: sc for sc in scopes}
        keys = [{"pk": {"S": pk}} for pk in by_key]
        found: list[StoredRecord] = []
        while keys:
            batch, keys = keys[:_BATCH_GET], keys[_BATCH_GET:]
            answer = self.client.batch_get_item(
                RequestItems={self.table_name: {"Keys": batch, "ConsistentRead": True}}
            )
            found += [scoped_record(item) for item in answer["Responses"].get(self.table_name, [])
                      if is_record(item)]
            keys += answer.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
        return found

    # -- cleanup --------------------------------------------------------------------------------
    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        """Records: one Query per status and shard for ``expires_at <= now`` and one
        conditional ``UpdateItem`` (to a tombstone) each.  Counters: one Query per shard for
        changes older than ``counters_before``, then one transaction each that deletes the
        counter only while its scope has no record and it is unchanged."""

        def run(_: Any) -> int:
            purged = 0
            for tag, status in (("S", Status.SUCCESS), ("F", Status.FAILED)):
                for item in self._oldest(tag, " AND gs <= :now", {":now": n(now)},
                                         limit - purged):
                    purged += self._purge_record(item, status, now)
                if purged >= limit:
                    break
            self._purge_counters(counters_before, limit)
            return purged

        return self._call("delete_expired", run) if limit > 0 else 0

    def _purge_record(self, item: Mapping[str, Any], status: Status, now: float) -> int:
        digest = self._keys.digest(scoped_record(item).scope)
        try:
            self._write(
                "update_item", Key=self._keys.record(digest),
                ConditionExpression="st = :st AND ex <= :now",
                UpdateExpression=f"{TOMBSTONE_REMOVE} SET {GC} = :gc",
                ExpressionAttributeValues={":st": s(status.value), ":now": n(now),
                                           ":gc": gc_at(0.0, self.gc_ttl)},
            )
        except Refused:
            return 0
        return 1

    def _purge_counters(self, before: float, limit: int) -> None:
        """The oldest ``limit`` counters *without a record* changed before ``before``: the
        index holds every counter, so candidates are read oldest first across the shards,
        page by page, and those whose scope has a record are passed over."""
        candidates = self._ordered("C", " AND gs < :before", {":before": n(before)}, limit)
        purged = 0
        while purged < limit:
            page = self._take(candidates, limit)
            if not page:
                return
            live = {r.scope for r in self._reread([_scope(c) for c in page])}
            for counter in page:
                if purged < limit and _scope(counter) not in live:
                    purged += self._purge_counter(counter)

    def _purge_counter(self, item: Mapping[str, Any]) -> int:
        digest = self._keys.digest(_scope(item))
        try:
            self._transact([
                {"ConditionCheck": {"Key": self._keys.record(digest),
                                    "ConditionExpression": "attribute_not_exists(st)"}},
                {"Delete": {"Key": self._keys.counter(digest),
                            "ConditionExpression": "ua = :ua",
                            "ExpressionAttributeValues": {":ua": item["ua"]}}},
            ])
        except Refused:
            return 0  # a record exists again, or the counter moved on: keep it
        return 1

    # -- operators ------------------------------------------------------------------------------
    def delete_record(self, scope: Scope, *, status: Status | None = None) -> StoredRecord | None:
        """Turn the record into a tombstone (only if it has ``status`` when given)."""
        condition, values = "attribute_exists(st)", {":gc": gc_at(0.0, self.gc_ttl)}
        if status is not None:
            condition, values[":st"] = "st = :st", s(Status(status).value)
        key = self._keys.record(self._keys.digest(scope))

        def run(_: Any) -> StoredRecord | None:
            try:
                answer = self._write(
                    "update_item", Key=key, ConditionExpression=condition,
                    UpdateExpression=f"{TOMBSTONE_REMOVE} SET {GC} = :gc",
                    ExpressionAttributeValues=values, ReturnValues="ALL_OLD",
                )
            except Refused:
                return None
            return scoped_record(answer["Attributes"])

        return self._call("delete_record", run)

    def reset_retry_count(self, scope: Scope) -> None:
        key = self._keys.counter(self._keys.digest(scope))
        self._call("reset_retry_count",
                   lambda c: c.delete_item(TableName=self.table_name, Key=key))

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        """A Scan of the whole table (an operator's tool: it reads every item), sorted."""
        filters = ["begins_with(pk, :rp)", "attribute_exists(st)"]
        values: dict[str, Any] = {":rp": s(self._keys.record_prefix())}
        for attr, name, value in (("st", ":s", status and Status(status).value),
                                  ("o", ":o", operation), ("t", ":t", tenant)):
            if value is not None:
                filters.append(f"{attr} = {name}")
                values[name] = s(value)

        def run(_: Any) -> list[StoredRecord]:
            rows = [scoped_record(i) for i in self._scan(" AND ".join(filters), values)]
            rows.sort(key=lambda r: (r.created_at, *r.scope))
            return rows[offset: offset + limit]

        return self._call("list_records", run)

    def _scan(self, filter_: str, values: dict[str, Any]) -> Iterator[dict[str, Any]]:
        request: dict[str, Any] = {"TableName": self.table_name, "FilterExpression": filter_,
                                   "ExpressionAttributeValues": values, "ConsistentRead": True}
        while True:
            answer = self.client.scan(**request)
            yield from answer.get("Items", [])
            if "LastEvaluatedKey" not in answer:
                return
            request["ExclusiveStartKey"] = answer["LastEvaluatedKey"]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        """Counts by (operation, status): every index partition read once (the index holds
        records only, no counters or tombstones; eventually consistent)."""

        def run(_: Any) -> dict[tuple[str, Status], int]:
            counts: dict[tuple[str, Status], int] = {}
            for tag, status in (("P", Status.PROCESSING), ("S", Status.SUCCESS),
                                ("F", Status.FAILED), ("U", Status.UNCERTAIN)):
                for partition in self._keys.partitions(tag):
                    for item in self._query(partition, "", {}, 1000):
                        key = (item["o"]["S"], status)
                        counts[key] = counts.get(key, 0) + 1
            return counts

        return self._call("stats", run)

    # -- maintenance leases -----------------------------------------------------------------------
    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        item = {**self._keys.lock(name), "ow": s(owner), "lx": n(now + ttl),
                GC: gc_at(ttl, self.gc_ttl)}

        def run(_: Any) -> bool:
            try:
                self._write("put_item", Item=item,
                            ConditionExpression=_LOCK_FREE,
                            ExpressionAttributeValues={":ow": s(owner), ":now": n(now)})
            except Refused:
                return False
            return True

        return self._call("acquire_lock", run)

    def release_lock(self, name: str, *, owner: str) -> None:
        def run(_: Any) -> None:
            with contextlib.suppress(Refused):  # not ours (any more): nothing to release
                self._write("delete_item", Key=self._keys.lock(name),
                            ConditionExpression="ow = :ow",
                            ExpressionAttributeValues={":ow": s(owner)})

        self._call("release_lock", run)


def _scope(item: Mapping[str, Any]) -> Scope:
    return Scope(item["t"]["S"], item["o"]["S"], item["k"]["S"])


def _sort_key(item: Mapping[str, Any]) -> float:
    return float(item["gs"]["N"])


__all__ = ["DynamoDBMaintenance"]
