"""Redis failover with a real primary + replica pair: what ``wait_replicas`` keeps.

Two ``redis-server`` processes of the test's own (free ports, no persistence); the replica
follows the primary through a loopback TCP proxy (``tests/_proxy.py``), which is how the
tests make the replica miss a write *deterministically*: while the proxy holds the link
(a latency of an hour), the primary's replication stream stops in the proxy, and the
primary is SIGKILLed before it is released — the replica never sees the write.  The
failover is what Sentinel would do: the primary is gone (verified: SIGKILLed, connection
refused), the replica is promoted with ``REPLICAOF NO ONE`` (verified: ``role:master``) and
the workers' stores point at it.

* ``wait_replicas=0``: a claim acknowledged by the primary alone is lost in the failover and
  a second worker claims the scope afresh: **the body runs twice** (the documented risk,
  asserted).
* ``wait_replicas=1``: the claim is acknowledged only after the replica has it; after the
  failover the second worker sees ``REQUEST_IN_PROGRESS``.  A claim the replica does not
  confirm is refused (``STORE_UNAVAILABLE``, the body does not run, the claim is withdrawn),
  and a SUCCESS it does not confirm is ``OUTCOME_NOT_RECORDED`` (not acked: the lease decides).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyHandler,
    OutcomeNotRecordedError,
    RedisStore,
    StoreUnavailableError,
)
from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores.base import ClaimRequest, SuccessWrite
from tests._proxy import TCPProxy
from tests.test_model import SETTINGS, StoreMachine

from .._wait import budget

pytestmark = pytest.mark.redis

HOLD = 3600.0  # the proxy's latency while it holds the replication link: "never"
SLOW = 0.3  # the proxy's latency for a slow link
#: The wait of a store whose replica is held: it is bound to run out.
WAIT_TIMEOUT = 0.3
#: The wait of a store whose replica is healthy: ample on a loaded 2-core machine (the
#: replica's acknowledgements cross a Python proxy).
CONFIRMED = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + budget(timeout)
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling a server's state


class Server:
    """One ``redis-server`` process of this test (never the machine's Redis on 6379)."""

    def __init__(self, workdir: Path, name: str, replicaof: int | None = None) -> None:
        self.port = free_port()
        self.workdir, self.name, self.replicaof = workdir, name, replicaof
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> Server:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--logfile", str(self.workdir / f"{self.name}.log"),
                "--dbfilename", f"{self.name}.rdb", "--repl-diskless-sync-delay", "0"]
        if self.replicaof is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replicaof)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, f"{self.name} to answer PING")
        return self

    def _answers(self) -> bool:
        try:
            with self.client() as c:
                return bool(c.ping())
        except redis.ConnectionError:
            return False

    def info(self) -> dict[str, Any]:
        with self.client() as c:
            return dict(c.info("replication"))

    def sigkill(self) -> None:
        """SIGKILL, verified: the process died of it and the port refuses connections."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(budget(10)) == -signal.SIGKILL
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.port), timeout=budget(1)).close()

    def promote(self) -> None:
        """``REPLICAOF NO ONE``, verified: the server now reports itself a master."""
        with self.client() as c:
            c.execute_command("REPLICAOF", "NO", "ONE")
        wait_until(lambda: self.info()["role"] == "master", f"{self.name} to be promoted")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(budget(10))


@dataclass
class Pair:
    primary: Server
    link: TCPProxy
    replica: Server
    prefix: str = field(default_factory=lambda: f"fo_{uuid.uuid4().hex[:8]}")
    stores: list[RedisStore] = field(default_factory=list)

    def store(self, server: Server, *, pooled: bool = False, **options: Any) -> RedisStore:
        """A store on ``server``: built from its URL (the hot path's held connections), or
        given a client with a blocking pool (``pooled``: every call through a pipeline)."""
        target: Any = server.url
        if pooled:
            pool = redis.BlockingConnectionPool.from_url(server.url, socket_timeout=5)
            target = redis.Redis(connection_pool=pool)
        store = RedisStore(target, prefix=self.prefix, socket_timeout=5, connect_timeout=1,
                           **options)
        store.create_schema()  # loads the scripts, as a deployment's migrate step does
        self.stores.append(store)
        return store

    def handler(self, server: Server, **store_options: Any) -> IdempotencyHandler:
        return IdempotencyHandler(
            self.store(server, **store_options), metrics=None, lease_timeout=30,
            outcome_retry_timeout=0.2,
        )

    def hold_link(self) -> None:
        """The primary's replication stream stops in the proxy from now on."""
        self.link.set_latency(HOLD)

    def fail_over(self) -> None:
        """The primary dies, whatever the proxy still holds is dropped, the replica is
        promoted (each step verified)."""
        self.primary.sigkill()
        self.link.drop()
        self.replica.promote()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    primary = Server(tmp_path, "primary").start()
    link = TCPProxy(primary.port).start()
    replica = Server(tmp_path, "replica", replicaof=link.port)
    try:
        replica.start()
        wait_until(lambda: replica.info().get("master_link_status") == "up"
                   and replica.info().get("master_sync_in_progress") == 0,
                   "the replica to finish its first sync")
        assert primary.info()["connected_slaves"] == 1
        pair = Pair(primary, link, replica)
        yield pair
        for store in pair.stores:
            store.close()
    finally:
        replica.stop()
        link.stop()
        primary.stop()


class Body:
    """A body that signals it started and then waits to be let go (no sleeps)."""

    def __init__(self, name: str, runs: list[str]) -> None:
        self.name, self.runs = name, runs
        self.started = threading.Event()
        self.finish = threading.Event()

    def __call__(self) -> str:
        self.runs.append(self.name)
        self.started.set()
        assert self.finish.wait(budget(30))
        return self.name


def in_thread(handler: IdempotencyHandler, body: Body, key: str) -> tuple[threading.Thread, list[Any]]:
    outcomes: list[Any] = []
    thread = threading.Thread(
        target=lambda: outcomes.append(handler.run(body, operation="pay", tenant="acme", key=key)),
        daemon=True,
    )
    thread.start()
    return thread, outcomes


def commands_sent(server: Server, name: str) -> int:
    with server.client() as c:
        stats = c.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


def test_failover_without_wait_replicas_loses_the_claim_and_the_body_runs_twice(
    pair: Pair,
) -> None:
    """The documented risk: replication is asynchronous, the replica missed the claim."""
    runs: list[str] = []
    key = f"k-{uuid.uuid4()}"
    first = pair.handler(pair.primary)
    pair.hold_link()
    body = Body("worker-1", runs)
    thread, _ = in_thread(first, body, key)
    assert body.started.wait(budget(10))  # claimed on the primary; the body is running
    on_replica = pair.handler(pair.replica)
    assert on_replica.get_record(operation="pay", tenant="acme", key=key) is None
    pair.fail_over()

    second = pair.handler(pair.replica)
    again = Body("worker-2", runs)
    again.finish.set()
    outcome = second.run(again, operation="pay", tenant="acme", key=key)
    assert outcome.kind == "executed"
    assert runs == ["worker-1", "worker-2"]  # the double run
    body.finish.set()
    thread.join(budget(10))
    assert commands_sent(pair.replica, "wait") == 0  # wait_replicas=0 sends no WAIT at all


def test_failover_with_wait_replicas_keeps_the_claim(pair: Pair) -> None:
    """The link is slow (each chunk held 0.3 s): without the WAIT the claim would return
    long before the replica has it, and the check below would see nothing there."""
    runs: list[str] = []
    key = f"k-{uuid.uuid4()}"
    first = pair.handler(pair.primary, wait_replicas=1, wait_timeout=CONFIRMED)
    pair.link.set_latency(SLOW)
    body = Body("worker-1", runs)
    thread, outcomes = in_thread(first, body, key)
    assert body.started.wait(budget(10))  # acknowledged: the replica has confirmed the claim
    on_replica = pair.handler(pair.replica).get_record(operation="pay", tenant="acme", key=key)
    assert on_replica is not None and on_replica.status.value == "PROCESSING"
    pair.fail_over()

    second = pair.handler(pair.replica, wait_replicas=1, wait_timeout=WAIT_TIMEOUT)
    outcome = second.run(Body("worker-2", runs), operation="pay", tenant="acme", key=key)
    assert outcome.kind == "in_progress"
    assert outcome.error_code is ErrorCode.REQUEST_IN_PROGRESS
    assert runs == ["worker-1"]
    body.finish.set()  # its primary is gone: the SUCCESS cannot be written
    thread.join(budget(10))
    assert outcomes[0].error_code is ErrorCode.OUTCOME_NOT_RECORDED


def test_a_claim_the_replica_does_not_confirm_is_refused_and_withdrawn(pair: Pair) -> None:
    runs: list[str] = []
    key = f"k-{uuid.uuid4()}"
    first = pair.handler(pair.primary, wait_replicas=1, wait_timeout=WAIT_TIMEOUT)
    pair.hold_link()
    outcome = first.run(Body("worker-1", runs), operation="pay", tenant="acme", key=key)
    assert outcome.kind == "store_unavailable"
    assert outcome.error_code is ErrorCode.STORE_UNAVAILABLE
    assert outcome.detail is not None and "1 claim(s) withdrawn" in outcome.detail
    assert runs == []  # fail closed: the body did not run
    assert first.get_record(operation="pay", tenant="acme", key=key) is None  # withdrawn
    pair.fail_over()

    second = pair.handler(pair.replica)
    done = Body("worker-2", runs)
    done.finish.set()
    assert second.run(done, operation="pay", tenant="acme", key=key).kind == "executed"
    assert runs == ["worker-2"]


def test_a_success_the_replica_does_not_confirm_is_not_recorded(pair: Pair) -> None:
    """After the body: ``OUTCOME_NOT_RECORDED`` (integrations do not ack it); the replica
    still has the confirmed claim, so after the failover the lease decides — no re-run."""
    runs: list[str] = []
    key = f"k-{uuid.uuid4()}"
    first = pair.handler(pair.primary, wait_replicas=1, wait_timeout=CONFIRMED)
    body = Body("worker-1", runs)
    thread, outcomes = in_thread(first, body, key)
    assert body.started.wait(budget(10))
    pair.hold_link()
    body.finish.set()
    thread.join(budget(10))
    assert outcomes[0].kind == "store_unavailable"
    assert outcomes[0].error_code is ErrorCode.OUTCOME_NOT_RECORDED
    on_primary = first.get_record(operation="pay", tenant="acme", key=key)
    assert on_primary is not None and on_primary.status.value == "SUCCESS"  # applied there only
    pair.fail_over()

    second = pair.handler(pair.replica)
    outcome = second.run(Body("worker-2", runs), operation="pay", tenant="acme", key=key)
    assert outcome.kind == "in_progress"
    assert runs == ["worker-1"]


@pytest.mark.parametrize("pooled", [False, True], ids=["held-connection", "pool"])
def test_waits_go_with_the_write_in_one_round_trip(pair: Pair, pooled: bool) -> None:
    """With replicas healthy every claim and outcome write is confirmed (one WAIT each),
    batches included; reads and duplicates are answered as usual."""
    handler = pair.handler(pair.primary, wait_replicas=1, wait_timeout=CONFIRMED, pooled=pooled)
    before = commands_sent(pair.primary, "wait")
    keys = [f"k-{uuid.uuid4()}" for _ in range(3)]
    assert handler.run(lambda: 1, operation="pay", tenant="acme", key=keys[0]).kind == "executed"
    assert handler.run(lambda: 1, operation="pay", tenant="acme", key=keys[0]).kind == "replayed"
    calls = [{"operation": "pay", "key": k, "tenant": "acme"} for k in keys[1:]]
    assert [o.kind for o in handler.run_many(calls, lambda call: call["key"])] == [
        "executed", "executed"
    ]
    # claim + SUCCESS, the duplicate's claim, the batch's claims (one pipeline, one WAIT)
    # and its two successes (written one by one without batch_completion)
    assert commands_sent(pair.primary, "wait") - before == 6
    replica = pair.handler(pair.replica)
    for k in keys:
        rec = replica.get_record(operation="pay", tenant="acme", key=k)
        assert rec is not None and rec.status.value == "SUCCESS"


def test_wait_options_are_checked() -> None:
    with pytest.raises(ConfigurationError):
        RedisStore("redis://127.0.0.1:1/0", wait_replicas=-1)
    with pytest.raises(ConfigurationError):
        RedisStore("redis://127.0.0.1:1/0", wait_replicas=1, wait_timeout=0)
    with pytest.raises(ConfigurationError):  # the socket would give up on the WAIT first
        RedisStore("redis://127.0.0.1:1/0", wait_replicas=1, wait_timeout=5, socket_timeout=5)
    with pytest.raises(ConfigurationError, match="Cluster"):
        RedisStore("redis+cluster://127.0.0.1:1", wait_replicas=1)


def test_a_store_that_waits_keeps_the_store_contract(pair: Pair) -> None:
    """The contract's model (tests/test_model.py) run against a waiting store: with the
    replica healthy, every primitive answers exactly as without ``wait_replicas``."""
    store = pair.store(pair.primary, wait_replicas=1, wait_timeout=CONFIRMED)
    machine = type("WaitingStoreMachine", (StoreMachine,), {"store": store})
    run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=25))


def test_every_write_the_replica_does_not_confirm_is_refused(pair: Pair) -> None:
    """At the store: claims and heartbeats raise STORE_UNAVAILABLE (claims withdrawn, a
    takeover's counted attempt kept), outcome writes OUTCOME_NOT_RECORDED (applied on the
    primary); calls that write nothing are answered as usual."""
    plain = pair.store(pair.primary)
    waiting = pair.store(pair.primary, wait_replicas=1, wait_timeout=WAIT_TIMEOUT)
    pair.hold_link()
    now = time.time()
    s = [Scope("acme", "pay", f"k{i}-{uuid.uuid4().hex[:6]}") for i in range(8)]

    def claim(scope: Scope, lease: float = 30) -> int:
        return plain.create(scope, request_hash="h", now=now, lease_expires_at=now + lease
                            ).record.fencing_token

    with pytest.raises(StoreUnavailableError, match="1 claim"):
        waiting.create(s[0], request_hash="h", now=now, lease_expires_at=now + 30)
    assert plain.get(s[0]) is None
    with pytest.raises(StoreUnavailableError, match="2 claim"):
        waiting.create_many([ClaimRequest(s[1], "h"), ClaimRequest(s[2], "h")], now=now,
                            lease_expires_at=now + 30)
    assert plain.get(s[1]) is None and plain.get(s[2]) is None
    expired = claim(s[3], lease=-1)
    with pytest.raises(StoreUnavailableError, match="1 claim"):
        waiting.take_over(s[3], expected_token=expired, now=now, lease_expires_at=now + 30)
    assert plain.get(s[3]) is None and plain.get_retry_count(s[3]) == 1
    with pytest.raises(StoreUnavailableError):
        waiting.heartbeat(s[4], token=claim(s[4]), now=now, lease_expires_at=now + 60)

    with pytest.raises(OutcomeNotRecordedError):
        waiting.mark_success(s[5], token=claim(s[5]), response=b"r", now=now,
                             expires_at=now + 60)
    with pytest.raises(OutcomeNotRecordedError):
        waiting.mark_success_many([SuccessWrite(s[6], claim(s[6]), b"r", now + 60),
                                   SuccessWrite(s[7], claim(s[7]), b"r", now + 60)], now=now)
    assert [plain.get(x).status.value for x in s[5:8]] == ["SUCCESS"] * 3  # type: ignore[union-attr]
    token = claim(s[0])
    with pytest.raises(OutcomeNotRecordedError):
        waiting.record_failure(s[0], token=token, now=now, max_retries=3, expires_at=now + 60)
    assert plain.get(s[0]) is None and plain.get_retry_count(s[0]) == 1
    for write in ("mark_failed", "release"):
        token = claim(s[0])
        with pytest.raises(OutcomeNotRecordedError):
            if write == "release":
                waiting.release(s[0], token=token)
            else:
                waiting.mark_failed(s[0], token=token, now=now, expires_at=now + 60)
        plain.delete_record(s[0])

    assert waiting.create(s[5], request_hash="h", now=now, lease_expires_at=now + 30).created \
        is False  # a duplicate wrote nothing: answered as usual
    assert waiting.release(s[5], token=1) is False  # a refused write: as usual


def test_a_reopen_the_replica_does_not_confirm_is_refused_and_withdrawn(pair: Pair) -> None:
    """``reopen`` is a claim too: unconfirmed, it is STORE_UNAVAILABLE and withdrawn (the new
    attempt released with its own token), so the redelivery claims the scope afresh; a
    refused reopen wrote nothing and is answered as usual."""
    plain = pair.store(pair.primary)
    waiting = pair.store(pair.primary, wait_replicas=1, wait_timeout=WAIT_TIMEOUT)
    pair.hold_link()
    now = time.time()
    scope = Scope("acme", "pay", f"reopen-{uuid.uuid4().hex[:6]}")
    token = plain.create(scope, request_hash="h", now=now, lease_expires_at=now + 30
                         ).record.fencing_token
    assert plain.mark_success(scope, token=token, response=b"r", now=now, expires_at=now + 60)
    assert waiting.reopen(scope, expected_token=token + 1, now=now,
                          lease_expires_at=now + 30) is None  # refused: as usual
    with pytest.raises(StoreUnavailableError, match="1 claim"):
        waiting.reopen(scope, expected_token=token, now=now, lease_expires_at=now + 30)
    assert plain.get(scope) is None and plain.get_retry_count(scope) == 0


# -- clients managed by Sentinel ------------------------------------------------------------
@pytest.fixture
def sentinel_port(tmp_path: Path) -> Iterator[int]:
    """A primary of the test's own and one ``redis-server --sentinel`` monitoring it as
    ``primary``."""
    primary = Server(tmp_path, "watched").start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor primary 127.0.0.1 {primary.port} 1\n")
    proc = subprocess.Popen(["redis-server", str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def knows_the_primary() -> bool:
        try:
            with redis.Redis(port=port, socket_timeout=1) as s:
                return s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "primary") is not None
        except redis.ConnectionError:
            return False

    try:
        wait_until(knows_the_primary, "the sentinel to answer for its primary")
        yield port
    finally:
        proc.kill()
        proc.wait(budget(10))
        primary.stop()


def test_sync_and_async_stores_on_sentinel_clients_share_their_records(
    sentinel_port: int,
) -> None:
    """``RedisStore`` on ``redis.sentinel`` and ``AsyncRedisStore`` on
    ``redis.asyncio.sentinel``: clients passed in are used as they are."""
    import asyncio

    import redis.asyncio.sentinel
    import redis.sentinel

    from idempotent_tasks import AsyncRedisStore

    prefix = f"sn_{uuid.uuid4().hex[:8]}"
    sentinels = [("127.0.0.1", sentinel_port)]
    sync_client = redis.sentinel.Sentinel(sentinels, socket_timeout=5).master_for("primary")
    store = RedisStore(sync_client, prefix=prefix)
    handler = IdempotencyHandler(store, metrics=None)
    assert handler.run(lambda: "sync", operation="pay", tenant="acme", key="s").kind == "executed"

    async def main() -> None:
        client = redis.asyncio.sentinel.Sentinel(sentinels, socket_timeout=5).master_for("primary")
        twin = AsyncRedisStore(client, prefix=prefix)
        h = IdempotencyHandler(twin, metrics=None)

        async def body() -> str:
            return "async"

        replay = await h.run_async(body, operation="pay", tenant="acme", key="s")
        assert (replay.kind, replay.result) == ("replayed", "sync")
        assert (await h.run_async(body, operation="pay", tenant="acme", key="a")).kind == "executed"
        await twin.close()
        await client.aclose()

    try:
        asyncio.run(main())
        assert handler.run(lambda: "x", operation="pay", tenant="acme", key="a").result == "async"
    finally:
        store.drop_schema()
        store.close()
        sync_client.close()


def test_the_async_store_waits_for_replicas_the_same_way(pair: Pair) -> None:
    """``AsyncRedisStore`` runs the same protocol: its claims and outcome writes are
    confirmed with one WAIT each (in the write's round trip), and a claim the replica does
    not confirm is refused and withdrawn before the body runs."""
    import asyncio

    from idempotent_tasks import AsyncRedisStore

    async def body() -> str:
        return "ok"

    async def main() -> None:
        healthy = AsyncRedisStore(pair.primary.url, prefix=pair.prefix, wait_replicas=1,
                                  wait_timeout=CONFIRMED)
        short = AsyncRedisStore(pair.primary.url, prefix=pair.prefix, wait_replicas=1,
                                wait_timeout=WAIT_TIMEOUT)
        try:
            await healthy.create_schema()  # the scripts loaded (a NOSCRIPT retry waits again)
            h = IdempotencyHandler(healthy, metrics=None, outcome_retry_timeout=0.2)
            before = commands_sent(pair.primary, "wait")
            assert (await h.run_async(body, operation="pay", tenant="acme", key="a")).kind == (
                "executed"
            )
            assert commands_sent(pair.primary, "wait") - before == 2  # claim + SUCCESS
            pair.hold_link()
            refused = await IdempotencyHandler(short, metrics=None).run_async(
                body, operation="pay", tenant="acme", key="b"
            )
            assert refused.error_code is ErrorCode.STORE_UNAVAILABLE
            assert refused.detail is not None and "1 claim(s) withdrawn" in refused.detail
        finally:
            await healthy.close()
            await short.close()

    asyncio.run(asyncio.wait_for(main(), budget(60)))
    assert pair.replica.info()["role"] == "slave"
