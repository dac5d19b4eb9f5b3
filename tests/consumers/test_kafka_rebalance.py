"""KafkaConsumerLoop through real group rebalances on Tansu: a second consumer *process*
joins mid-run, and one leaves mid-run (SIGTERM, inside a body).

What must hold (docs/consumers.md, the loop's spec sheet):

* a partition's committed offset never passes a message whose outcome is not durable —
  not after a poll, not when the partition is revoked, not when its consumer leaves: a
  message held in a retry (its body fails while ``<prefix>:hold`` exists) keeps the
  commit at its own offset through every rebalance;
* nothing is lost: every message's body ran to its effect, every partition is committed to
  its end;
* nothing runs twice: each message's effect is counted once (exactly-once effects through
  the store: the Redis store under the test's own prefix, shared by the processes).

Tansu answers a join after ~half of ``session.timeout.ms`` (6 s here), so each rebalance
costs ~3 s; the waits below are for events the loops report, never sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from idempotent_tasks import RedisStore

from .._services import REDIS_URL, require
from .conftest import committed, create_topic, kafka_config, produce, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

WORKER = Path(__file__).with_name("_rebalance_worker.py")
ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
REBALANCE = 60.0  # bound on one rebalance (Tansu: ~3 s per join)


@dataclass
class Group:
    """Consumer processes of one group on one topic, and what they reported."""

    bootstrap: str
    workdir: Path
    strategy: str = "range"
    topic: str = ""
    prefix: str = field(default_factory=lambda: f"rb_{uuid.uuid4().hex[:8]}")
    kafka: dict[str, Any] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    sent: dict[int, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topic = create_topic(self.bootstrap, partitions=PARTITIONS, prefix="rebalance")
        self.kafka = {**kafka_config(self.bootstrap),
                      "partition.assignment.strategy": self.strategy}
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.sent = {p: [] for p in range(PARTITIONS)}

    def start(self, name: str) -> None:
        cfg = {"name": name, "prefix": self.prefix, "redis": REDIS_URL, "kafka": self.kafka,
               "topic": self.topic}
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(cfg)], env={**os.environ,
            "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, name: str) -> None:
        """SIGTERM: the loop finishes the message in hand, commits, leaves the group."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (self.workdir / f"{name}.log").read_text()[-3000:]

    def send(self, partition: int, count: int, **special: int) -> None:
        """``count`` messages to ``partition``; ``hold=i`` / ``gate=i`` mark the i-th."""
        start = len(self.sent[partition])
        records = []
        for i in range(start, start + count):
            key = f"p{partition}-{i}"
            value: dict[str, Any] = {"key": key}
            value.update({flag: True for flag, at in special.items() if at == i})
            records.append({"value": json.dumps(value).encode(), "partition": partition,
                            "headers": {"idempotency-key": key}})
            self.sent[partition].append(key)
        produce(self.bootstrap, self.topic, records)

    # -- what the workers reported -----------------------------------------------------------
    def _list(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.redis.lrange(f"{self.prefix}:{name}", 0, -1)]

    def effects(self) -> dict[str, int]:
        raw = self.redis.hgetall(f"{self.prefix}:effects")
        return {k.decode(): int(v) for k, v in raw.items()}

    def outcomes(self) -> list[dict[str, Any]]:
        return self._list("outcomes")

    def assigned(self, name: str) -> set[int]:
        """The partitions ``name`` owns now, from its events in order: an assignment adds
        partitions, a revocation or loss removes them (eager rebalancing revokes all, then
        assigns; incremental moves only some)."""
        owned: set[int] = set()
        for e in self._list("events"):
            if e["worker"] != name or e["event"] == "consumer_stopped":
                continue
            parts = {int(p.rsplit("[", 1)[1][:-1]) for p in e["partitions"]}
            owned = owned | parts if e["event"] == "partitions_assigned" else owned - parts
        return owned

    def wait_split(self, *names: str) -> dict[str, set[int]]:
        """Wait until the group is stable with every partition owned by one of ``names``."""
        def split() -> bool:
            got = [self.assigned(n) for n in names]
            owned = [p for parts in got for p in parts]
            return all(got) and len(owned) == len(set(owned)) == PARTITIONS
        wait_for(split, REBALANCE, f"partitions split over {names}")
        return {n: self.assigned(n) for n in names}

    def committed(self) -> list[int]:
        return committed(self.bootstrap, self.kafka["group.id"], self.topic, PARTITIONS)

    def wait_done(self) -> None:
        everything = {k for keys in self.sent.values() for k in keys}
        ends = [len(self.sent[p]) for p in range(PARTITIONS)]
        try:
            wait_for(lambda: set(self.effects()) == everything and self.committed() == ends,
                     REBALANCE, "every message's effect and every partition committed")
        except pytest.fail.Exception as exc:  # say which partitions and messages are missing
            missing = sorted(everything - set(self.effects()))
            owners = {n: sorted(self.assigned(n)) for n in self.procs}
            raise AssertionError(f"{exc}\ncommitted {self.committed()}, ends {ends}; no effect "
                                 f"for {missing}; owners now {owners}") from exc

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        keys = list(self.redis.scan_iter(match=f"{self.prefix}:*"))
        if keys:
            self.redis.delete(*keys)
        RedisStore(REDIS_URL, prefix=self.prefix).drop_schema()
        self.redis.close()


@pytest.fixture(params=["range", "cooperative-sticky"])
def group(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    """Eager rebalancing (every partition revoked, then reassigned) and incremental
    (only the partitions that move are revoked)."""
    require("redis")
    g = Group(kafka_bootstrap, tmp_path, request.param)
    yield g
    g.close()


def executed_by(group: Group, keys: set[str]) -> set[str]:
    return {o["worker"] for o in group.outcomes() if o["key"] in keys and o["kind"] == "executed"}


def test_rebalance_when_a_second_consumer_joins_mid_run(group: Group) -> None:
    group.redis.set(f"{group.prefix}:hold", 1)
    for p in range(PARTITIONS):
        group.send(p, 10, hold=5 if p == 0 else -1)
    group.start("a")
    first = {k for p in range(1, PARTITIONS) for k in group.sent[p]} | set(group.sent[0][:5])
    wait_for(lambda: set(group.effects()) == first
             and any(o["kind"] == "failed" for o in group.outcomes()), REBALANCE,
             "every message but the held one and those behind it")
    wait_for(lambda: group.committed() == [5, 10, 10, 10], REBALANCE, "the durable commits")

    group.start("b")  # joins while a holds a retry on partition 0
    split = group.wait_split("a", "b")
    assert split["a"] and split["b"]
    assert group.committed() == [5, 10, 10, 10], "a revoke committed past a retry"

    group.redis.delete(f"{group.prefix}:hold")
    for p in range(PARTITIONS):
        group.send(p, 10)
    group.wait_done()
    assert set(group.effects().values()) == {1}  # nothing ran twice
    second = {k for keys in group.sent.values() for k in keys[10:]}
    assert executed_by(group, second) == {"a", "b"}  # both consumed after the rebalance
    group.stop("a")
    group.stop("b")


def test_rebalance_when_a_consumer_leaves_mid_run(group: Group) -> None:
    group.start("a")
    group.start("b")
    split = group.wait_split("a", "b")
    leaver = "a" if 0 in split["a"] else "b"
    stays = "b" if leaver == "a" else "a"
    other = min(split[leaver] - {0})  # the leaver's second partition: a retry pending there
    group.redis.set(f"{group.prefix}:hold", 1)
    group.send(other, 8, hold=5)
    wait_for(lambda: any(o["kind"] == "failed" and o["worker"] == leaver
                         for o in group.outcomes()), REBALANCE, "the held message's retry")
    group.send(0, 8, gate=3)
    wait_for(lambda: group.redis.lrange(f"{group.prefix}:in-gate", 0, -1) == [leaver.encode()],
             REBALANCE, "the leaver inside the gated body")

    group.procs[leaver].send_signal(signal.SIGTERM)  # mid-body: it must finish, then leave
    group.redis.rpush(f"{group.prefix}:gate", "open")
    group.stop(leaver)
    revoked = group.committed()
    assert revoked[0] == 4, "the body in hand finished and was committed on the way out"
    assert revoked[other] == 5, "the commit on the way out went past the held retry"

    wait_for(lambda: len(group.assigned(stays)) == PARTITIONS, REBALANCE,
             "the remaining consumer to own every partition")
    group.redis.delete(f"{group.prefix}:hold")
    for p in range(PARTITIONS):
        group.send(p, 5)
    group.wait_done()
    assert set(group.effects().values()) == {1}
    gated = group.sent[0][3]
    assert executed_by(group, {gated}) == {leaver}
    assert executed_by(group, {group.sent[other][5]}) == {stays}
    group.stop(stays)
