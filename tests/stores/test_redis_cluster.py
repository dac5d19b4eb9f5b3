"""The whole store contract against RedisStore on a real 3-master Redis Cluster.

A session-scoped fixture starts three ``redis-server --cluster-enabled yes`` processes on
free loopback ports, joins them with ``redis-cli --cluster create`` and waits until every
node reports ``cluster_state:ok``; the servers are stopped at teardown.  Every contract
test function is imported from ``test_store_contract.py`` and run here with a store whose
client is a ``RedisCluster``.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from idempotent_tasks._core.records import Scope
from idempotent_tasks.stores._feed import scope_digest
from idempotent_tasks.stores.base import ClaimRequest, Store
from idempotent_tasks.stores.redis import RedisStore

from .._wait import budget
from . import test_store_contract as contract
from .test_redis_store import free_port, start_redis, stop_redis, wait_until

redis = pytest.importorskip("redis")
from redis.cluster import RedisCluster  # noqa: E402

pytestmark = pytest.mark.redis

NOW = 1_700_000_000.0
CONTRACT: list[Callable[[Store], None]] = [
    fn for name, fn in sorted(vars(contract).items()) if name.startswith("test_")
]


def free_cluster_port(taken: list[int]) -> int:
    """A free port whose cluster-bus port (port + 10000) is free and valid as well."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535 or port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _cluster_ok(port: int) -> bool:
    client = redis.Redis(port=port, socket_timeout=0.5)
    try:
        info = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
        return bool(info.get("cluster_state") == "ok")
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def cluster_ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server / redis-cli are not installed")
    workdir: Path = tmp_path_factory.mktemp("redis-cluster")
    ports: list[int] = []
    for _ in range(3):
        ports.append(free_cluster_port(ports))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            conf = str(workdir / f"nodes-{port}.conf")
            procs.append(start_redis(port, workdir, "--cluster-enabled", "yes",
                                     "--cluster-config-file", conf))  # fmt: skip
        nodes = [f"127.0.0.1:{p}" for p in ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=budget(60),
        )  # fmt: skip
        for port in ports:
            wait_until(partial(_cluster_ok, port), f"cluster node {port} not ok", timeout=30)
        yield ports
    finally:
        for proc in procs:
            stop_redis(proc)


@pytest.fixture
def cluster_store(cluster_ports: list[int]) -> Iterator[RedisStore]:
    client = RedisCluster(host="127.0.0.1", port=cluster_ports[0], socket_timeout=5)
    store = RedisStore(client, prefix=f"ct_{uuid.uuid4().hex[:10]}")
    store.create_schema()
    try:
        yield store
    finally:
        store.drop_schema()
        left = list(client.scan_iter(match=f"{store.prefix}:*"))  # every master is scanned
        client.close()
    assert left == [], "drop_schema left keys behind"


@pytest.mark.parametrize("contract_test", CONTRACT, ids=lambda fn: fn.__name__)
def test_contract_on_redis_cluster(
    contract_test: Callable[[Store], None], cluster_store: RedisStore
) -> None:
    contract_test(cluster_store)


def test_the_contract_was_collected() -> None:
    assert len(CONTRACT) >= 20


def test_records_spread_over_every_master(
    cluster_store: RedisStore, cluster_ports: list[int]
) -> None:
    claims = [ClaimRequest(Scope("t", "op", str(i)), "h") for i in range(300)]
    results = cluster_store.create_many(claims, now=NOW, lease_expires_at=NOW + 30)
    assert all(r.created for r in results)
    per_node = []
    for port in cluster_ports:
        node = redis.Redis(port=port)
        per_node.append(sum(1 for _ in node.scan_iter(match=f"{cluster_store.prefix}:*:r")))
        node.close()
    assert sum(per_node) == 300 and all(n > 0 for n in per_node)
    again = cluster_store.create_many(
        [ClaimRequest(c.scope, "h") for c in claims], now=NOW, lease_expires_at=NOW + 30
    )
    assert [r.record.fencing_token for r in again] == [r.record.fencing_token for r in results]
    assert len({r.record.fencing_token for r in results}) == 300  # unique across shards
    assert len(cluster_store.find_stuck(now=NOW + 31, heartbeat_before=None, limit=1000)) == 300


def test_cluster_url_builds_the_client_on_first_use(cluster_ports: list[int]) -> None:
    store = RedisStore(
        f"redis+cluster://127.0.0.1:{cluster_ports[0]}", prefix=f"cu_{uuid.uuid4().hex[:8]}"
    )
    try:
        scope = Scope("t", "op", "k")
        first: Any = store.create(scope, request_hash="h", now=NOW, lease_expires_at=NOW + 1)
        assert first.created
    finally:
        store.drop_schema()
        store.close()


def test_dead_cluster_url_constructs_and_fails_on_use() -> None:
    from idempotent_tasks import StoreUnavailableError

    store = RedisStore("redis+cluster://127.0.0.1:1", connect_timeout=0.5)
    with pytest.raises(StoreUnavailableError):
        store.get(Scope("t", "op", "k"))


# -- AsyncRedisStore on redis.asyncio's RedisCluster: the same protocol, the same contract ----
class _OnALoop:
    """An async store's coroutine methods as blocking calls, run on a loop thread of its own
    (the contract tests are sync); any other attribute is the store's own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(budget(60))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        return lambda *args, **kwargs: self.run(attr(*args, **kwargs))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(budget(10))
        self.loop.close()


@pytest.fixture
def async_cluster_store(cluster_ports: list[int]) -> Iterator[Any]:
    """An ``AsyncRedisStore`` on a ``redis+cluster://`` URL (``redis.asyncio``'s
    ``RedisCluster``), driven from the test's thread."""
    from idempotent_tasks import AsyncRedisStore

    url = f"redis+cluster://127.0.0.1:{cluster_ports[0]}"
    store = _OnALoop(AsyncRedisStore(url, prefix=f"ca_{uuid.uuid4().hex[:10]}"))
    try:
        store.create_schema()
        yield store
        store.drop_schema()
        client = RedisCluster(host="127.0.0.1", port=cluster_ports[0], socket_timeout=5)
        left = list(client.scan_iter(match=f"{store.prefix}:*"))
        client.close()
        assert left == [], "drop_schema left keys behind"
    finally:
        store.close()
        store.stop()


@pytest.mark.parametrize("contract_test", CONTRACT, ids=lambda fn: fn.__name__)
def test_contract_on_redis_cluster_through_redis_asyncio(
    contract_test: Callable[[Store], None], async_cluster_store: Store
) -> None:
    contract_test(async_cluster_store)


def test_async_batches_go_per_shard_and_spread_over_every_master(
    async_cluster_store: Any, cluster_ports: list[int]
) -> None:
    claims = [ClaimRequest(Scope("t", "op", str(i)), "h") for i in range(300)]
    results = async_cluster_store.create_many(claims, now=NOW, lease_expires_at=NOW + 30)
    assert all(r.created for r in results)
    per_node = []
    for port in cluster_ports:
        node = redis.Redis(port=port)
        per_node.append(sum(1 for _ in node.scan_iter(match=f"{async_cluster_store.prefix}:*:r")))
        node.close()
    assert sum(per_node) == 300 and all(n > 0 for n in per_node)
    stuck = async_cluster_store.find_stuck(now=NOW + 31, heartbeat_before=None, limit=1000)
    assert len(stuck) == 300


# -- the change feed: plain pub/sub, which a cluster forwards to every node -----------------
def _digests_pending(feed: Any, scopes: list[Scope]) -> bool:
    return all(feed.pending(scope_digest(s)) for s in scopes)


def test_the_change_feed_wakes_waiters_of_every_slot_from_any_node(
    cluster_store: RedisStore, cluster_ports: list[int]
) -> None:
    """One subscription (on one node) hears announcements published on any node."""
    scopes = [Scope("t", "op", str(i)) for i in range(12)]
    woken: dict[Scope, bool] = {}
    threads = [
        threading.Thread(target=lambda s=s: woken.update({s: cluster_store.wait_for_change(
            s, timeout=budget(60))}))
        for s in scopes
    ]  # fmt: skip
    for t in threads:
        t.start()
    feed = cluster_store._feed
    wait_until(lambda: feed.subscribed.is_set() and _digests_pending(feed, scopes),
               "the waiters registered and subscribed")  # fmt: skip
    nodes = [redis.Redis(port=port) for port in cluster_ports]
    for i, scope in enumerate(scopes[:-1]):  # published on each node in turn
        nodes[i % len(nodes)].publish(feed.channel, scope_digest(scope))
    cluster_store.announce_change(scopes[-1])  # and through the store's cluster client
    for node in nodes:
        node.close()
    for t in threads:
        t.join(budget(10))
    assert woken == dict.fromkeys(scopes, True)


def test_a_sync_cluster_announcement_wakes_an_async_cluster_waiter(
    async_cluster_store: Any, cluster_ports: list[int]
) -> None:
    if not hasattr(async_cluster_store.client, "pubsub"):
        pytest.skip("this redis-py has no redis.asyncio cluster pub/sub")
    inner = async_cluster_store.inner
    scopes = [Scope("t", "op", str(i)) for i in range(6)]
    futures = [
        asyncio.run_coroutine_threadsafe(
            inner.wait_for_change(s, timeout=budget(60)), async_cluster_store.loop
        )
        for s in scopes
    ]
    feed = inner._feed
    wait_until(
        lambda: any(f.subscribed.is_set() for f in list(feed._loops.values()))
        and _digests_pending(feed, scopes),
        "the async waiters registered and subscribed",
    )
    client = RedisCluster(host="127.0.0.1", port=cluster_ports[1], socket_timeout=5)
    announcer = RedisStore(client, prefix=inner.prefix)
    for scope in scopes:
        announcer.announce_change(scope)
    announcer.close()
    client.close()
    assert [f.result(budget(10)) for f in futures] == [True] * len(scopes)
