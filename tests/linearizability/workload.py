"""The operations each process runs against a store, and the worker process that runs them.

A :class:`Workload` draws random operations of the store contract on a few scopes (so that
processes contend): claims, takeovers, heartbeats, the three outcome writes, releases, and
reads.  Writes mostly use the token of the process's own latest claim, sometimes a token it
read (another process's attempt) or an older one (a stale owner).  ``now`` is the wall clock
and leases and lifetimes are short (0 to 20 ms), so leases expire, takeovers succeed and
finished records expire and get replaced during the run.

``python -m tests.linearizability.workload CONFIG_JSON`` is one worker process: it builds
its store, connects, writes its ``ready`` file, waits for a line on stdin (so all workers
start together), then runs until the ``stop`` file exists, recording every operation.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyError
from idempotent_tasks._core.records import CreateResult, Scope
from idempotent_tasks.stores.base import Store, TakeOver

from .history import Recorder

WEIGHTS = {
    "create": 22, "get": 14, "take_over": 10, "heartbeat": 8, "mark_success": 16,
    "mark_failed": 5, "release": 8, "record_failure": 12, "get_retry_count": 5,
}
FOLLOW_UPS = ("mark_success", "mark_success", "record_failure", "release", "mark_failed",
              "heartbeat")
LEASES = (0.0, 0.001, 0.003, 0.01)
LIFETIMES = (0.0, 0.002, 0.005, 0.02)
HASHES = ("h1", "h2")
TENANT = "lin"


class Workload:
    def __init__(self, store: Store, recorder: Recorder, *, keys: list[str], seed: int) -> None:
        self.store, self.recorder, self.keys = store, recorder, keys
        self.rng = random.Random(seed)
        self.own: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.stale: dict[str, list[int]] = {}
        self.names = list(WEIGHTS)
        self.weights = list(WEIGHTS.values())
        self.count = 0
        self.follow: str | None = None  # the scope we just claimed

    def run(self, ops: int) -> None:
        for _ in range(ops):
            self.step()

    def run_until(
        self, stop: Callable[[], bool], *, think: float = 0.0, check_every: int = 16
    ) -> None:
        """Run until ``stop()``; ``think`` is the mean pause between operations (a
        Jepsen-style stagger, so that a run spans the faults instead of finishing in a few
        milliseconds)."""
        while self.count % check_every or not stop():
            self.step()
            if think:
                time.sleep(self.rng.uniform(0, 2 * think))

    def step(self) -> None:
        self.count += 1
        key, name, own = self._next()
        scope = Scope(TENANT, "op", key)
        args, call = self._call(name, key, scope, own)
        try:
            value = self.recorder.call(name, scope, args, call)
        except IdempotencyError:  # recorded as indeterminate; the next call reconnects
            return
        self._learn(name, key, value)

    def _next(self) -> tuple[str, str, bool]:
        """Mostly what the engine does after a claim — an outcome write (or a heartbeat) by
        the new owner on the same scope — else any operation on any scope."""
        follow, self.follow = self.follow, None
        if follow is not None and self.rng.random() < 0.7:
            return follow, self.rng.choice(FOLLOW_UPS), True
        return self.rng.choice(self.keys), self.rng.choices(self.names, self.weights)[0], False

    def _token(self, key: str) -> int:
        """The latest token we know of for the scope (ours or one we read: the current
        attempt, as recovery would use it), our own, or an older one of ours (stale)."""
        known = [t for t in (self.own.get(key), self.seen.get(key)) if t is not None]
        r = self.rng.random()
        if r < 0.5 and known:
            return max(known)
        if r < 0.8 and key in self.own:
            return self.own[key]
        stale = self.stale.get(key)
        if stale:
            return self.rng.choice(stale)
        return max(known, default=1)

    def _call(
        self, name: str, key: str, scope: Scope, own: bool
    ) -> tuple[dict[str, Any], Callable[[], Any]]:
        """The arguments (as the history records them) and the store call; ``own``: with
        the token of our latest claim of the scope."""
        s, rng, now = self.store, self.rng, time.time()
        lease, exp = now + rng.choice(LEASES), now + rng.choice(LIFETIMES)
        tok = self.own[key] if own else self._token(key)
        only = rng.random() < 0.5
        calls: dict[str, tuple[dict[str, Any], Callable[[], Any]]] = {
            "create": ({"h": (h := rng.choice(HASHES)), "now": now, "lease": lease},
                       lambda: s.create(scope, request_hash=h, now=now, lease_expires_at=lease)),
            "take_over": ({"tok": tok, "now": now, "lease": lease},
                          lambda: s.take_over(scope, expected_token=tok, now=now,
                                              lease_expires_at=lease)),
            "heartbeat": ({"tok": tok, "now": now, "lease": lease},
                          lambda: s.heartbeat(scope, token=tok, now=now, lease_expires_at=lease)),
            "mark_success": ({"tok": tok, "resp": (r := f"{self.recorder.process}-{self.count}"),
                              "now": now, "exp": exp},
                             lambda: s.mark_success(scope, token=tok, response=r.encode(),
                                                    now=now, expires_at=exp)),
            "mark_failed": ({"tok": tok, "now": now, "exp": exp, "only": only},
                            lambda: s.mark_failed(scope, token=tok, now=now, expires_at=exp,
                                                  only_if_lease_expired=only)),
            "release": ({"tok": tok}, lambda: s.release(scope, token=tok)),
            "record_failure": ({"tok": tok, "now": now, "max": (m := rng.randint(1, 3)),
                                "exp": exp, "only": only},
                               lambda: s.record_failure(scope, token=tok, now=now, max_retries=m,
                                                        expires_at=exp,
                                                        only_if_lease_expired=only)),
            "get": ({}, lambda: s.get(scope)),
            "get_retry_count": ({}, lambda: s.get_retry_count(scope)),
        }
        return calls[name]

    def _learn(self, name: str, key: str, value: Any) -> None:
        token: int | None = None
        if isinstance(value, CreateResult):
            if not value.created:
                self.seen[key] = value.record.fencing_token
                return
            token = value.record.fencing_token
        elif isinstance(value, TakeOver):
            token = value.token
        elif name == "get" and value is not None:
            self.seen[key] = value.fencing_token
        if token is not None:
            self.follow = key
            if key in self.own:
                self.stale.setdefault(key, []).append(self.own[key])
            self.own[key] = token


def build_store(kind: str, url: str, prefix: str | None) -> Store:
    """The worker's own store (short timeouts: a stalled link must not hang the run)."""
    from idempotent_tasks import RedisStore, SQLStore

    if kind == "redis":
        assert prefix is not None
        return RedisStore(url, prefix=prefix, connect_timeout=2, socket_timeout=5)
    if kind == "postgres":
        assert prefix is not None
        return SQLStore(url, table_prefix=prefix, connect_timeout=2, socket_timeout=5,
                        pool_size=1)
    return SQLStore(url, connect_timeout=5)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    store = build_store(cfg["kind"], cfg["url"], cfg.get("prefix"))
    for key in cfg["keys"]:
        store.get(Scope(TENANT, "op", key))  # connect before the start line
    Path(cfg["ready"]).write_text("ready")
    sys.stdin.readline()  # the runner starts the workers at once, a spare when it is needed
    recorder = Recorder(Path(cfg["history"]), cfg["process"])
    stop = Path(cfg["stop"])
    workload = Workload(store, recorder, keys=cfg["keys"], seed=cfg["seed"])
    workload.run_until(stop.exists, think=cfg["think"])
    recorder.close()
    store.close()


if __name__ == "__main__":
    main()
