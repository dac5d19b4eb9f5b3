"""The Redis stores' maintenance and operator plans: recovery's stuck records, the purge of
expired records and stale counters, listings, statistics, the maintenance leases, and the
schema's (the scripts') set-up and removal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..._core.records import Status, StoredRecord
from ._client import SCRIPTS, glob_escape
from ._records import FIELDS, record, scope_of
from ._scripts import Command, Plan, Scan, ScriptPlans, all_checked, checked

#: Records read (or keys deleted) per round trip by the operator scans.
SCAN_CHUNK: Final = 1000


class MaintenancePlans(ScriptPlans):
    """The maintenance and operator half of the Redis protocol."""

    def find_stuck(
        self, now: float, heartbeat_before: float | None, limit: int
    ) -> Plan[list[StoredRecord]]:
        """Candidates come from each shard's processing index in lease-expiry order; each is
        re-read and kept only if its own fields say it is stuck.  The result is sorted by
        ``updated_at`` (oldest first) and cut to ``limit``; when more than ``limit`` records
        are stuck, those whose leases expired first are the ones considered."""
        if limit <= 0:
            return []
        page = max(limit, 100)
        offsets = dict.fromkeys(self.shards, 0)
        found: list[StoredRecord] = []
        while offsets and len(found) < limit:
            pages: list[list[bytes]] = all_checked((yield [
                ("ZRANGEBYSCORE", self.shards[s].processing, "-inf", now, "LIMIT", off, page)
                for s, off in offsets.items()
            ]))
            for shard, members in zip(list(offsets), pages, strict=True):
                kept, dropped = yield from self._check_stuck(shard, members, now, heartbeat_before)
                found += kept
                offsets[shard] += len(members) - dropped
                if len(members) < page:
                    del offsets[shard]
        found.sort(key=lambda r: r.updated_at)
        return found[:limit]

    def _check_stuck(
        self, shard: str, members: Sequence[bytes], now: float, heartbeat_before: float | None
    ) -> Plan[tuple[list[StoredRecord], int]]:
        """The stuck records among ``members``, and how many index entries left the
        ``<= now`` window: dropped (record GC'd by Redis, or no longer PROCESSING) or
        re-scored from the record's own lease, decided by a script on the record."""
        kept: list[StoredRecord] = []
        dropped = 0
        base, processing = self.shards[shard].base, self.shards[shard].processing
        rows = yield from self._read_records(base, members)
        for member, v in zip(members, rows, strict=True):
            if v[0] != b"PROCESSING" or (v[6] and float(v[6]) > now):
                record_key = f"{base}{member.decode()}:r"
                yield from self.eval("prune_processing", (record_key, processing), ())
                dropped += 1
                continue
            found = record(scope_of(v), v)
            if heartbeat_before is None or found.updated_at < heartbeat_before:
                kept.append(found)
        return kept, dropped

    def _read_records(self, base: str, members: Sequence[bytes]) -> Plan[list[Sequence[bytes]]]:
        rows: list[Sequence[bytes]] = []
        for i in range(0, len(members), SCAN_CHUNK):
            rows += all_checked((yield [
                ("HMGET", f"{base}{m.decode()}:r", *FIELDS) for m in members[i : i + SCAN_CHUNK]
            ]))
        return rows

    def delete_expired(self, now: float, counters_before: float, limit: int) -> Plan[int]:
        """One purge script per shard that has work (found with one pipelined ``ZCOUNT``
        round), each re-checking every candidate against the record itself."""
        limit = max(limit, 0)
        commands: list[Command] = []
        for s in self.shards.values():
            commands.append(("ZCOUNT", s.finished, "-inf", now))
            commands.append(("ZCOUNT", s.counter_index, "-inf", counters_before))
        counts = iter(all_checked((yield commands)))
        busy = [s for s in self.shards.values() if next(counts) + next(counts) > 0]
        purged = 0
        for s in busy:
            args = (now, counters_before, limit - purged, max(limit, 1), s.base)
            reply = yield from self.eval("purge_shard", (s.finished, s.counter_index), args)
            purged += int(reply[0])
        return purged

    def _all_records(self) -> Plan[list[StoredRecord]]:
        commands: list[Command] = []
        for s in self.shards.values():
            commands.append(("ZRANGE", s.processing, 0, -1))
            commands.append(("ZRANGE", s.finished, 0, -1))
        pages = iter(all_checked((yield commands)))
        found: list[StoredRecord] = []
        for s in self.shards.values():
            members = sorted(set(next(pages)) | set(next(pages)))
            for v in (yield from self._read_records(s.base, members)):
                if v[0] is not None and v[8] is not None:
                    found.append(record(scope_of(v), v))
        return found

    def list_records(
        self,
        status: Status | None,
        operation: str | None,
        tenant: str | None,
        limit: int,
        offset: int,
    ) -> Plan[list[StoredRecord]]:
        rows = [
            r
            for r in (yield from self._all_records())
            if (status is None or r.status is status)
            and (operation is None or r.scope.operation == operation)
            and (tenant is None or r.scope.tenant == tenant)
        ]
        rows.sort(key=lambda r: (r.created_at, r.scope.tenant, r.scope.operation, r.scope.key))
        return rows[offset : offset + limit]

    def stats(self) -> Plan[Mapping[tuple[str, Status], int]]:
        counts: dict[tuple[str, Status], int] = {}
        for r in (yield from self._all_records()):
            k = (r.scope.operation, r.status)
            counts[k] = counts.get(k, 0) + 1
        return counts

    def acquire_lock(self, name: str, owner: str, now: float, ttl: float) -> Plan[bool]:
        args = (owner, now, now + ttl, self.gc_ms)
        return bool((yield from self.eval("acquire_lock", (self._lock_key(name),), args)))

    def release_lock(self, name: str, owner: str) -> Plan[None]:
        yield from self.eval("release_lock", (self._lock_key(name),), (owner,))

    def _lock_key(self, name: str) -> str:
        return f"{self.prefix}:{{lock}}:{name}"

    # -- the schema -------------------------------------------------------------------------
    def create_schema(self) -> Plan[None]:
        """Nothing to create (each shard's token counter is made by its first claim); loads
        the scripts (on every primary in Cluster), which also proves the server is
        reachable.  Idempotent."""
        for name in SCRIPTS:
            yield from self.load(name)

    def drop_schema(self) -> Plan[None]:
        """Delete every key under this store's prefix (tests, decommissioning)."""
        keys: list[Any] = checked((yield Scan(glob_escape(self.prefix) + ":{*")))
        for i in range(0, len(keys), SCAN_CHUNK):
            all_checked((yield [("UNLINK", key) for key in keys[i : i + SCAN_CHUNK]]))
