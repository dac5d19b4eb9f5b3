"""RedisStore's maintenance and operator scans: recovery's stuck records, the purge of
expired records and stale counters, listings, statistics and the maintenance leases."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ..._core.records import Status, StoredRecord
from ._client import command, unavailable
from ._plumbing import SCAN_CHUNK, RedisPlumbing
from ._records import FIELDS, record, scope_of


class RedisMaintenance(RedisPlumbing):
    """The maintenance and operator half of RedisStore."""

    def find_stuck(
        self, *, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        """Candidates come from each shard's processing index in lease-expiry order; each is
        re-read and kept only if its own fields say it is stuck.  The result is sorted by
        ``updated_at`` (oldest first) and cut to ``limit``; when more than ``limit`` records
        are stuck, those whose leases expired first are the ones considered."""
        if limit <= 0:
            return []
        try:
            found = self._scan_stuck(now, heartbeat_before, limit)
        except self._errors as exc:
            raise unavailable("find_stuck", exc) from exc
        found.sort(key=lambda r: r.updated_at)
        return found[:limit]

    def _scan_stuck(
        self, now: float, heartbeat_before: float | None, limit: int
    ) -> list[StoredRecord]:
        page = max(limit, 100)
        offsets = dict.fromkeys(self._shards, 0)
        found: list[StoredRecord] = []
        while offsets and len(found) < limit:
            pages = self._index_pages(offsets, now, page)
            for shard, members in pages.items():
                kept, dropped = self._check_stuck(shard, members, now, heartbeat_before)
                found += kept
                offsets[shard] += len(members) - dropped
                if len(members) < page:
                    del offsets[shard]
        return found

    def _index_pages(
        self, offsets: Mapping[str, int], now: float, page: int
    ) -> dict[str, list[bytes]]:
        pipe = self._conn().pipeline(transaction=False)
        for shard, offset in offsets.items():
            processing = self._shards[shard].processing
            command(pipe, "ZRANGEBYSCORE", processing, "-inf", now, "LIMIT", offset, page)
        return dict(zip(offsets, pipe.execute(), strict=True))

    def _check_stuck(
        self, shard: str, members: Sequence[bytes], now: float, heartbeat_before: float | None
    ) -> tuple[list[StoredRecord], int]:
        """The stuck records among ``members``, and how many index entries left the
        ``<= now`` window: dropped (record GC'd by Redis, or no longer PROCESSING) or
        re-scored from the record's own lease, decided by a script on the record."""
        kept: list[StoredRecord] = []
        dropped = 0
        base, processing = self._shards[shard].base, self._shards[shard].processing
        for member, v in zip(members, self._read_records(base, members), strict=True):
            if v[0] != b"PROCESSING" or (v[6] and float(v[6]) > now):
                record_key = f"{base}{member.decode()}:r"
                self._eval(self._scripts["prune_processing"], (record_key, processing), ())
                dropped += 1
                continue
            found = record(scope_of(v), v)
            if heartbeat_before is None or found.updated_at < heartbeat_before:
                kept.append(found)
        return kept, dropped

    def _read_records(self, base: str, members: Sequence[bytes]) -> list[Sequence[bytes]]:
        rows: list[Sequence[bytes]] = []
        for i in range(0, len(members), SCAN_CHUNK):
            pipe = self._conn().pipeline(transaction=False)
            for m in members[i : i + SCAN_CHUNK]:
                command(pipe, "HMGET", f"{base}{m.decode()}:r", *FIELDS)
            rows += pipe.execute()
        return rows

    def delete_expired(self, *, now: float, counters_before: float, limit: int) -> int:
        """One purge script per shard that has work (found with one pipelined ``ZCOUNT``
        round), each re-checking every candidate against the record itself."""
        try:
            return self._purge(now, counters_before, max(limit, 0))
        except self._errors as exc:
            raise unavailable("delete_expired", exc) from exc

    def _purge(self, now: float, counters_before: float, limit: int) -> int:
        pipe = self._conn().pipeline(transaction=False)
        for s in self._shards.values():
            command(pipe, "ZCOUNT", s.finished, "-inf", now)
            command(pipe, "ZCOUNT", s.counter_index, "-inf", f"({counters_before!r}")
        counts = iter(pipe.execute())
        busy = [s for s in self._shards.values() if next(counts) + next(counts) > 0]
        purged = 0
        for s in busy:
            args = (now, counters_before, limit - purged, max(limit, 1), s.base)
            keys = (s.finished, s.counter_index)
            reply = self._eval(self._scripts["purge_shard"], keys, args)
            purged += int(reply[0])
        return purged

    def _all_records(self) -> Iterator[StoredRecord]:
        pipe = self._conn().pipeline(transaction=False)
        for s in self._shards.values():
            command(pipe, "ZRANGE", s.processing, 0, -1)
            command(pipe, "ZRANGE", s.finished, 0, -1)
        pages = iter(pipe.execute())
        for s in self._shards.values():
            members = sorted(set(next(pages)) | set(next(pages)))
            for v in self._read_records(s.base, members):
                if v[0] is not None and v[8] is not None:
                    yield record(scope_of(v), v)

    def list_records(
        self,
        *,
        status: Status | None = None,
        operation: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[StoredRecord]:
        try:
            rows = [
                r
                for r in self._all_records()
                if (status is None or r.status is status)
                and (operation is None or r.scope.operation == operation)
                and (tenant is None or r.scope.tenant == tenant)
            ]
        except self._errors as exc:
            raise unavailable("list_records", exc) from exc
        rows.sort(key=lambda r: (r.created_at, r.scope.tenant, r.scope.operation, r.scope.key))
        return rows[offset : offset + limit]

    def stats(self) -> Mapping[tuple[str, Status], int]:
        counts: dict[tuple[str, Status], int] = {}
        try:
            for r in self._all_records():
                k = (r.scope.operation, r.status)
                counts[k] = counts.get(k, 0) + 1
        except self._errors as exc:
            raise unavailable("stats", exc) from exc
        return counts

    def acquire_lock(self, name: str, *, owner: str, now: float, ttl: float) -> bool:
        args = (owner, now, now + ttl, self._gc_ms)
        return bool(self._run("acquire_lock", None, (self._lock_key(name),), args))

    def release_lock(self, name: str, *, owner: str) -> None:
        self._run("release_lock", None, (self._lock_key(name),), (owner,))

    def _lock_key(self, name: str) -> str:
        return f"{self.prefix}:{{lock}}:{name}"
