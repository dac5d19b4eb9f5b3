"""RedisStore beyond the shared contract: failure modes, key layout, GC TTLs, the index.

The contract itself runs against Redis through ``tests/stores/test_store_contract.py``
(``-k redis``).  Tests that stop a server start their own ``redis-server`` on a free port;
the shared one on 6379 is never stopped.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from idempotent_tasks import (
    ConfigurationError,
    ErrorCode,
    IdempotencyError,
    StoreUnavailableError,
)
from idempotent_tasks._core.records import Scope, Status
from idempotent_tasks.stores.base import ClaimRequest, Store, SuccessWrite
from idempotent_tasks.stores.redis import RedisStore, driver_errors

from .._services import REDIS_URL, require
from .._wait import budget

redis = pytest.importorskip("redis")
from redis.crc import key_slot  # noqa: E402

pytestmark = pytest.mark.redis

NOW = 1_700_000_000.0
S = Scope("acme", "payments.charge", "k-1")


# -- helpers shared with test_redis_cluster.py -------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_redis(
    port: int, workdir: Path, *extra: str, password: str | None = None
) -> subprocess.Popen[bytes]:
    """A private redis-server on ``port`` (with ``password``: ``--requirepass``), answering
    PING before this returns."""
    auth = ["--requirepass", password] if password is not None else []
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir), "--daemonize", "no", *auth, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until(lambda: _pings(port, password), f"redis-server on port {port} did not start",
               proc)
    return proc


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=budget(10))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until(
    condition: Callable[[], bool],
    message: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 15.0,
) -> None:
    """Poll ``condition`` (a readiness check, not a sleep that hopes) until it holds."""
    deadline = time.monotonic() + budget(timeout)
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{message}: exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.02)


def _pings(port: int, password: str | None = None) -> bool:
    client = redis.Redis(port=port, password=password, socket_connect_timeout=0.2,
                         socket_timeout=0.2)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


def claim(store: Store, scope: Scope = S, now: float = NOW) -> Any:
    return store.create(scope, request_hash="h", now=now, lease_expires_at=now + 30)


def token_of(store: Store, scope: Scope = S, now: float = NOW) -> int:
    """Claim ``scope`` (it must be free) and return the new attempt's token."""
    result = claim(store, scope, now)
    assert result.created, result
    token: int = result.record.fencing_token
    return token


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture
def rstore() -> Iterator[RedisStore]:
    require("redis")
    store = RedisStore(REDIS_URL, prefix=f"rt_{uuid.uuid4().hex[:10]}", gc_ttl=1000)
    store.create_schema()
    try:
        yield store
    finally:
        store.drop_schema()
        store.close()


@pytest.fixture
def raw() -> Iterator[Any]:
    require("redis")
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


# -- store down ---------------------------------------------------------------------------
CALLS: dict[str, Callable[[Store], object]] = {
    "create": lambda s: claim(s),
    "create_many": lambda s: s.create_many(
        [ClaimRequest(S, "h"), ClaimRequest(Scope("a", "b", "c"), "h")],
        now=NOW,
        lease_expires_at=NOW + 1,
    ),
    "get": lambda s: s.get(S),
    "take_over": lambda s: s.take_over(S, expected_token=1, now=NOW, lease_expires_at=NOW + 1),
    "reopen": lambda s: s.reopen(S, expected_token=1, now=NOW, lease_expires_at=NOW + 1),
    "heartbeat": lambda s: s.heartbeat(S, token=1, now=NOW, lease_expires_at=NOW + 1),
    "mark_success": lambda s: s.mark_success(S, token=1, response=b"1", now=NOW, expires_at=NOW),
    "mark_success_many": lambda s: s.mark_success_many(
        [SuccessWrite(S, 1, b"1", NOW), SuccessWrite(Scope("a", "b", "c"), 2, b"2", NOW)], now=NOW
    ),
    "mark_failed": lambda s: s.mark_failed(S, token=1, now=NOW, expires_at=NOW),
    "release": lambda s: s.release(S, token=1),
    "record_failure": lambda s: s.record_failure(
        S, token=1, now=NOW, max_retries=3, expires_at=NOW
    ),
    "save_steps": lambda s: s.save_steps(S, token=1, steps=b"{}", now=NOW),  # type: ignore[attr-defined]
    "load_steps": lambda s: s.load_steps(S),  # type: ignore[attr-defined]
    "mark_uncertain": lambda s: s.mark_uncertain(  # type: ignore[attr-defined]
        S, token=1, now=NOW, detail=None
    ),
    "resolve_uncertain": lambda s: s.resolve_uncertain(  # type: ignore[attr-defined]
        S, resolution="retry", now=NOW
    ),
    "get_retry_count": lambda s: s.get_retry_count(S),
    "reset_retry_count": lambda s: s.reset_retry_count(S),
    "delete_record": lambda s: s.delete_record(S),
    "find_stuck": lambda s: s.find_stuck(now=NOW, heartbeat_before=None, limit=10),
    "delete_expired": lambda s: s.delete_expired(now=NOW, counters_before=NOW, limit=10),
    "list_records": lambda s: s.list_records(),
    "stats": lambda s: s.stats(),
    "acquire_lock": lambda s: s.acquire_lock("x", owner="w", now=NOW, ttl=1),
    "release_lock": lambda s: s.release_lock("x", owner="w"),
    "create_schema": lambda s: s.create_schema(),
    "drop_schema": lambda s: s.drop_schema(),  # type: ignore[attr-defined]
    "announce_change": lambda s: s.announce_change(S),  # type: ignore[attr-defined]
}
#: Methods that never raise for a server that is down (what they do instead: tested apart).
NEVER_RAISE = {"close", "wait_for_change"}


def test_every_store_method_is_covered_by_the_store_down_table() -> None:
    public = {n for n, _ in inspect.getmembers(RedisStore, inspect.isfunction) if n[0] != "_"}
    assert public - NEVER_RAISE == set(CALLS)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_closed_port_fails_fast_with_store_unavailable(call: str) -> None:
    store = RedisStore("redis://127.0.0.1:1/0", connect_timeout=0.5)  # never connects here
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        CALLS[call](store)
    assert time.monotonic() - start < 2.0
    assert info.value.code is ErrorCode.STORE_UNAVAILABLE
    assert isinstance(info.value.__cause__, driver_errors())


def test_silent_server_is_bounded_by_the_socket_timeout() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", connect_timeout=0.5, socket_timeout=0.3)
        start = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            claim(store)
        assert time.monotonic() - start < 2.0


def test_server_killed_mid_test_then_restarted(tmp_path: Path) -> None:
    require("redis")
    port = free_port()
    proc = start_redis(port, tmp_path)
    store = RedisStore(f"redis://127.0.0.1:{port}/0", connect_timeout=0.5, socket_timeout=1.0)
    try:
        store.create_schema()
        assert claim(store).created
        stop_redis(proc)
        for call in ("create", "get", "mark_success", "find_stuck"):
            with pytest.raises(StoreUnavailableError):
                CALLS[call](store)
        proc = start_redis(port, tmp_path)  # empty (no persistence) and without our scripts
        token = token_of(store)  # NOSCRIPT is handled: scripts load again
        assert store.mark_success(S, token=token, response=b"ok", now=NOW, expires_at=NOW + 9)
        replay = claim(store)
        assert not replay.created and replay.record.response == b"ok"
    finally:
        store.close()
        stop_redis(proc)


def test_scripts_flushed_on_the_server_are_loaded_again(tmp_path: Path) -> None:
    require("redis")
    port = free_port()
    proc = start_redis(port, tmp_path)
    store = RedisStore(f"redis://127.0.0.1:{port}/0")
    try:
        assert claim(store).created
        redis.Redis(port=port).script_flush()
        assert not claim(store).created
        results = store.create_many(
            [ClaimRequest(Scope("t", "op", str(i)), "h") for i in range(600)],
            now=NOW,
            lease_expires_at=NOW + 30,
        )  # more than one script call: the pipeline path
        assert all(r.created for r in results)
        redis.Redis(port=port).script_flush()
        again = store.create_many(
            [ClaimRequest(Scope("t", "op", str(i)), "h") for i in range(600)],
            now=NOW,
            lease_expires_at=NOW + 30,
        )
        assert [r.record.fencing_token for r in again] == [
            r.record.fencing_token for r in results
        ]
        owner = claim(store).record.fencing_token  # S is still claimed: a duplicate
        redis.Redis(port=port).script_flush()
        taken = store.take_over(S, expected_token=owner, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None and taken.retry_count == 1 and taken.token > owner
    finally:
        store.close()
        stop_redis(proc)


class _Raising:
    """A client whose every command raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc

    def pipeline(self, transaction: bool = False) -> Any:
        raise self.exc


def _driver_exception_classes() -> list[type[BaseException]]:
    from redis.exceptions import RedisClusterException, RedisError

    classes = {
        obj
        for obj in vars(redis.exceptions).values()
        if isinstance(obj, type) and issubclass(obj, RedisError | RedisClusterException)
    }
    return sorted(classes, key=lambda c: c.__name__)


def test_translation_covers_every_redis_exception_class() -> None:
    """Refused credentials are a configuration error (never retried); every other driver
    error is an outage."""
    classes = _driver_exception_classes()
    assert len(classes) > 20  # the module really was enumerated
    refused = (redis.exceptions.AuthenticationError,
               redis.exceptions.AuthenticationWrongNumberOfArgsError)
    for cls in classes:
        try:
            exc = cls("boom")
        except ValueError:  # redirections parse their message: "<slot> <host:port>"
            exc = cls("1234 127.0.0.1:7000")
        store = RedisStore(_Raising(exc))  # type: ignore[arg-type]
        expected = ConfigurationError if issubclass(cls, refused) else StoreUnavailableError
        for call in ("create", "get", "mark_success", "find_stuck", "create_many"):
            if cls is redis.exceptions.NoScriptError and call != "get":
                continue  # NOSCRIPT is handled (script loaded again), see the test above
            with pytest.raises(IdempotencyError) as info:
                CALLS[call](store)
            assert type(info.value) is expected, (cls, call)
            assert info.value.__cause__ is exc, (cls, call)


def test_programming_errors_are_not_disguised_as_store_outages() -> None:
    store = RedisStore(_Raising(ZeroDivisionError("bug")))  # type: ignore[arg-type]
    with pytest.raises(ZeroDivisionError):
        claim(store)


# -- key layout -----------------------------------------------------------------------------
def test_a_scope_and_its_index_share_one_slot_whatever_its_characters(
    rstore: RedisStore, raw: Any
) -> None:
    nasty = Scope("{tenant}", "op}{", "{k")
    t = token_of(rstore, nasty)
    rstore.record_failure(nasty, token=t, now=NOW, max_retries=1, expires_at=NOW + 9)
    keys = [k.decode() for k in raw.scan_iter(match=f"{rstore.prefix}:*", count=1000)]
    assert len(keys) == 5  # record, counter, finished index, counter index, token counter
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert not any("tenant" in k or "op}" in k for k in keys)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"prefix": "a{b}"}, "prefix"),
        ({"prefix": "a}"}, "prefix"),
        ({"prefix": ""}, "prefix"),
        ({"gc_ttl": 0}, "gc_ttl"),
        ({"gc_ttl": -1.0}, "gc_ttl"),
        ({"connect_timeout": 0}, "timeout"),
        ({"socket_timeout": -1}, "timeout"),
    ],
)
def test_bad_configuration_is_a_configuration_error(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named) as info:
        RedisStore("redis://127.0.0.1:6379/0", **options)
    assert info.value.code is ErrorCode.CONFIGURATION_ERROR
    assert not isinstance(info.value, ValueError)


def test_a_record_of_another_scope_under_our_key_is_never_served(
    rstore: RedisStore, raw: Any
) -> None:
    other = Scope("acme", "payments.charge", "k-2")
    assert claim(rstore, other).created
    ours, theirs = rstore._keys(S), rstore._keys(other)
    raw.copy(theirs.record, ours.record)  # what a digest collision would look like
    assert rstore.get(S) is None
    with pytest.raises(IdempotencyError):
        claim(rstore)


# -- garbage-collection TTLs and the index ---------------------------------------------------
def test_redis_ttls_are_logical_time_plus_gc_ttl(rstore: RedisStore, raw: Any) -> None:
    k = rstore._keys(S)
    t = token_of(rstore)  # lease 30 s, gc_ttl 1000 s
    assert 1029_000 < raw.pttl(k.record) <= 1030_000
    assert rstore.heartbeat(S, token=t, now=NOW + 10, lease_expires_at=NOW + 100)
    assert 1089_000 < raw.pttl(k.record) <= 1090_000
    taken = rstore.take_over(S, expected_token=t, now=NOW + 100, lease_expires_at=NOW + 130)
    assert taken is not None and taken.retry_count == 1
    assert 1029_000 < raw.pttl(k.counter) <= 1030_000
    assert rstore.mark_success(
        S, token=taken.token, response=b"1", now=NOW + 110, expires_at=NOW + 610
    )
    assert 1499_000 < raw.pttl(k.record) <= 1500_000
    assert 1499_000 < raw.pttl(k.counter) <= 1500_000
    other = Scope("t", "op", "released")
    rstore.record_failure(
        other, token=token_of(rstore, other), now=NOW, max_retries=5, expires_at=NOW + 5
    )
    assert 999_000 < raw.pttl(rstore._keys(other).counter) <= 1000_000
    assert raw.pttl(k.tokens) == -1  # the token counter never expires


def test_logical_expiry_ignores_redis_time(rstore: RedisStore) -> None:
    t = token_of(rstore, now=NOW)  # 2023 timestamps: long "expired" by Redis's own clock
    assert rstore.mark_success(S, token=t, response=b"1", now=NOW, expires_at=NOW + 5)
    assert not claim(rstore, now=NOW + 4).created
    assert claim(rstore, now=NOW + 5).created


def test_index_entries_of_garbage_collected_records_are_dropped(
    rstore: RedisStore, raw: Any
) -> None:
    stuck, done = Scope("t", "op", "stuck"), Scope("t", "op", "done")
    claim(rstore, stuck)
    t = token_of(rstore, done)
    rstore.mark_success(done, token=t, response=b"1", now=NOW, expires_at=NOW + 1)
    rstore.record_failure(done, token=t, now=NOW, max_retries=1, expires_at=NOW)  # no-op
    ks, kd = rstore._keys(stuck), rstore._keys(done)
    raw.delete(ks.record, kd.record)  # what Redis's own expiry does after gc_ttl
    assert rstore.find_stuck(now=NOW + 60, heartbeat_before=None, limit=10) == []
    assert raw.zscore(ks.processing, ks.member) is None
    assert rstore.delete_expired(now=NOW + 60, counters_before=NOW, limit=10) == 0
    assert raw.zscore(kd.finished, kd.member) is None


def test_find_stuck_pages_past_records_the_heartbeat_filter_skips(rstore: RedisStore) -> None:
    scopes = [Scope("t", "op", f"k{i}") for i in range(150)]
    claimed = rstore.create_many(
        [ClaimRequest(s, "h") for s in scopes], now=NOW, lease_expires_at=NOW + 1
    )
    old = Scope("t", "op", "old")
    claim(rstore, old, now=NOW - 100)  # lease NOW - 70, updated NOW - 100
    for s, r in zip(scopes, claimed, strict=True):
        assert rstore.heartbeat(
            s, token=r.record.fencing_token, now=NOW + 1, lease_expires_at=NOW + 2
        )
    found = rstore.find_stuck(now=NOW + 50, heartbeat_before=NOW - 50, limit=1)
    assert [r.scope for r in found] == [old]
    assert len(rstore.find_stuck(now=NOW + 50, heartbeat_before=None, limit=500)) == 151


def test_counter_of_a_scope_with_a_live_record_is_kept(rstore: RedisStore) -> None:
    rstore.record_failure(
        S, token=token_of(rstore), now=NOW, max_retries=1, expires_at=NOW + 10_000
    )
    assert rstore.delete_expired(now=NOW + 100, counters_before=NOW + 50, limit=10) == 0
    assert rstore.get_retry_count(S) == 1
    assert rstore.delete_expired(now=NOW + 10_000, counters_before=NOW + 9_000, limit=10) == 1
    rstore.delete_expired(now=NOW + 20_000, counters_before=NOW + 19_999, limit=10)
    assert rstore.get_retry_count(S) == 0


def test_create_many_replaces_expired_records_and_resets_their_counters(
    rstore: RedisStore,
) -> None:
    first = token_of(rstore)
    rstore.record_failure(S, token=first, now=NOW, max_retries=1, expires_at=NOW + 10)
    other = Scope("t", "op", "fresh")
    results = rstore.create_many(
        [ClaimRequest(S, "h2"), ClaimRequest(other, "h")],
        now=NOW + 10,
        lease_expires_at=NOW + 40,
    )
    assert [r.created for r in results] == [True, True]
    assert rstore.get_retry_count(S) == 0
    rec = rstore.get(S)
    assert rec is not None and rec.status is Status.PROCESSING and rec.request_hash == "h2"
    assert rec.fencing_token == results[0].record.fencing_token > first


class CountingConnection(redis.Connection):
    """A redis-py connection that counts the script calls it sends (per test, unlike the
    server's ``commandstats``, which every client of the shared Redis adds to)."""

    evalsha: ClassVar[int] = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, bytes | bytearray) else command
        type(self).evalsha += sum(bytes(c).count(b"EVALSHA") for c in chunks)
        super().send_packed_command(command, check_health)


@pytest.fixture
def counted() -> Iterator[tuple[RedisStore, type[CountingConnection]]]:
    """A store whose connections (pooled and held) count the script calls they send."""
    require("redis")
    counter = type("Counter", (CountingConnection,), {"evalsha": 0})
    pool = redis.ConnectionPool.from_url(REDIS_URL, connection_class=counter)
    store = RedisStore(redis.Redis(connection_pool=pool), prefix=f"rt_{uuid.uuid4().hex[:10]}")
    store.create_schema()
    try:
        yield store, counter
    finally:
        store.drop_schema()
        store.close()
        pool.disconnect()


def test_create_many_is_one_round_trip_per_500_scopes(
    counted: tuple[RedisStore, type[CountingConnection]],
) -> None:
    """The batch claim's cost model (its speed is measured in ``benchmarks/``): 1,200 scopes
    are three script calls, the first 500 one call, and no scope is claimed twice."""
    rstore, counter = counted
    claims = [ClaimRequest(Scope("t", "bulk", str(i)), "h") for i in range(1200)]
    before = counter.evalsha
    first = rstore.create_many(claims[:500], now=NOW, lease_expires_at=NOW + 30)
    assert counter.evalsha - before == 1
    rest = rstore.create_many(claims, now=NOW, lease_expires_at=NOW + 30)
    assert counter.evalsha - before == 1 + 3
    assert all(r.created for r in first)
    assert [r.created for r in rest] == [False] * 500 + [True] * 700
    tokens = [r.record.fencing_token for r in rest]
    assert tokens[:500] == [r.record.fencing_token for r in first]
    assert len(set(tokens)) == 1200


def test_mark_success_many_is_one_script_call_per_500_writes(
    counted: tuple[RedisStore, type[CountingConnection]],
) -> None:
    """The batch completion's cost model: 700 writes are two script calls (not one per
    write), each write still conditional on its own token: a stale one is refused, its
    record left as it was."""
    rstore, counter = counted
    claims = [ClaimRequest(Scope("t", "bulk-done", str(i)), "h") for i in range(700)]
    created = rstore.create_many(claims, now=NOW, lease_expires_at=NOW + 30)
    writes = [
        SuccessWrite(c.scope, r.record.fencing_token + (1 if i == 3 else 0), b"r%d" % i,
                     NOW + 60)
        for i, (c, r) in enumerate(zip(claims, created, strict=True))
    ]
    before = counter.evalsha
    written = rstore.mark_success_many(writes, now=NOW + 1)
    assert counter.evalsha - before == 2
    assert written == [i != 3 for i in range(700)]
    stale = rstore.get(claims[3].scope)
    assert stale is not None and stale.status is Status.PROCESSING
    done = rstore.get(claims[699].scope)
    assert done is not None and done.status is Status.SUCCESS and done.response == b"r699"
    assert done.expires_at == NOW + 60


# -- the hot path's per-thread connections ------------------------------------------------
def _connection_id(store: RedisStore) -> int:
    """The server's id of this thread's held connection (the one the scripts use)."""
    direct = store._transport.direct
    assert direct is not None
    return int(direct.execute("CLIENT", "ID"))


def test_each_thread_keeps_one_connection_of_its_own(rstore: RedisStore) -> None:
    both_connected = threading.Barrier(2, timeout=budget(10))
    ids: dict[str, tuple[int, int]] = {}

    def work(name: str) -> None:
        claim(rstore, Scope("t", "threads", name))
        first = _connection_id(rstore)
        both_connected.wait()  # both threads hold a connection at the same time
        claim(rstore, Scope("t", "threads", name))
        ids[name] = (first, _connection_id(rstore))

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ids["a"][0] == ids["a"][1] and ids["b"][0] == ids["b"][1]
    assert ids["a"][0] != ids["b"][0]


def test_a_connection_the_server_drops_fails_closed_then_is_replaced(
    rstore: RedisStore, raw: Any
) -> None:
    assert claim(rstore).created
    dropped = _connection_id(rstore)
    raw.execute_command("CLIENT", "KILL", "ID", dropped)
    outcomes: list[object] = []
    for _ in range(2):
        try:
            outcomes.append(claim(rstore).created)
        except StoreUnavailableError:
            outcomes.append("unavailable")  # this call's reply was lost: fail closed
    assert outcomes[-1] is False  # the next call reconnected and saw the first claim
    assert outcomes[0] in (False, "unavailable")
    assert _connection_id(rstore) != dropped


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_uses_its_parents_connection(rstore: RedisStore) -> None:
    token = token_of(rstore)
    parent = _connection_id(rstore)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection and its view of the claim, then exit
        try:
            seen = claim(rstore).record.fencing_token
            os.write(write_end, f"{_connection_id(rstore)} {seen}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    child, seen = map(int, os.read(read_end, 100).split())
    os.close(read_end)
    assert status == 0 and seen == token
    assert child != parent
    assert _connection_id(rstore) == parent  # the child left the parent's socket alone


def test_close_disconnects_the_held_connections_and_the_store_reconnects(
    rstore: RedisStore,
) -> None:
    assert claim(rstore).created
    before = _connection_id(rstore)
    rstore.close()
    assert not claim(rstore).created
    assert _connection_id(rstore) != before


@pytest.mark.parametrize(
    ("module", "check", "patched_name"),
    [("gevent.monkey", "is_module_patched", "threading"),
     ("eventlet.patcher", "is_monkey_patched", "thread")],
)
def test_green_threads_keep_the_pooled_client(
    monkeypatch: pytest.MonkeyPatch, module: str, check: str, patched_name: str
) -> None:
    """Under gevent/eventlet a "thread" is a greenlet per task: no held connections then.
    (Neither library is installed here; a stand-in module answers the same question.)"""
    require("redis")
    stand_in = types.ModuleType(module)
    setattr(stand_in, check, lambda name: name == patched_name)
    monkeypatch.setitem(sys.modules, module, stand_in)
    store = RedisStore(REDIS_URL, prefix=f"rt_{uuid.uuid4().hex[:10]}")
    try:
        assert store._transport.direct is None
        assert claim(store).created  # and the client path works as ever
    finally:
        store.drop_schema()
        store.close()


def test_only_plain_pools_get_held_connections() -> None:
    require("redis")
    plain = redis.Redis.from_url(REDIS_URL)
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(REDIS_URL))
    try:
        assert RedisStore(plain, prefix="held")._transport.direct is not None
        assert RedisStore(blocking, prefix="held")._transport.direct is None  # the pool's own
        assert RedisStore("redis+cluster://127.0.0.1:1", prefix="held")._transport.direct is None
    finally:
        plain.close()
        blocking.close()


# -- fencing tokens ----------------------------------------------------------------------------
def test_fencing_token_is_the_shard_counter_then_the_shard_number(
    rstore: RedisStore, raw: Any
) -> None:
    k = rstore._keys(S)
    shard = int(k.member[:2], 16)
    first = token_of(rstore)
    assert first == int(raw.get(k.tokens)) * 1000 + shard
    assert rstore.release(S, token=first)
    second = token_of(rstore)
    assert second == first + 1000  # the same shard's counter, one further
    assert not claim(rstore).created  # a duplicate draws nothing
    assert int(raw.get(k.tokens)) * 1000 + shard == second


@pytest.mark.parametrize("how", ["take_over", "replace_expired", "reopen"])
def test_fencing_tokens_move_past_a_record_of_an_earlier_version(
    rstore: RedisStore, raw: Any, how: str
) -> None:
    """Earlier versions wrote random 62-bit tokens: taking over, replacing or reopening such
    a record moves the shard's counter past it, so the new attempt's token is still
    greater."""
    old = 4_611_686_018_427_387_123
    t = token_of(rstore)
    k = rstore._keys(S)
    raw.hset(k.record, "tk", str(old))  # what an earlier version's claim left
    if how == "take_over":
        taken = rstore.take_over(S, expected_token=old, now=NOW + 31, lease_expires_at=NOW + 61)
        assert taken is not None
        new = taken.token
    elif how == "reopen":
        assert rstore.mark_success(S, token=old, response=b"1", now=NOW, expires_at=NOW + 5)
        reopened = rstore.reopen(S, expected_token=old, now=NOW + 1, lease_expires_at=NOW + 31)
        assert reopened is not None
        new = reopened
    else:
        assert rstore.mark_success(S, token=old, response=b"1", now=NOW, expires_at=NOW + 5)
        replaced = claim(rstore, now=NOW + 5)
        assert replaced.created
        new = replaced.record.fencing_token
    assert new > old > t
    assert new % 1000 == int(k.member[:2], 16)
    got = rstore.get(S)
    assert got is not None and got.fencing_token == new
    other = Scope("t", "op", "same-shard?")
    assert token_of(rstore, other) != new


# -- optional dependency ----------------------------------------------------------------------
def test_import_works_without_redis_and_the_store_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import idempotent_tasks\n"
        "from idempotent_tasks.caches import RedisCache\n"
        "try:\n"
        "    idempotent_tasks.RedisStore('redis://127.0.0.1:6379/0')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    RedisCache('redis://127.0.0.1:6379/0')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.count("pip install 'idempotent-tasks[redis]'") == 2


def test_mark_success_many_after_create_many_writes_each_scope_s_own_record(
    rstore: RedisStore,
) -> None:
    """The key names a batch claim computed are reused by the completion that follows (for
    speed); a scope that batch did not claim is named afresh: every write lands on its own
    record, whichever way its names were found."""
    batch = [Scope("t", "reuse", f"b{i}") for i in range(3)]
    other = Scope("t", "reuse", "single")
    tokens = [r.record.fencing_token for r in rstore.create_many(
        [ClaimRequest(s, "h") for s in batch], now=NOW, lease_expires_at=NOW + 30)]
    lone = rstore.create(other, request_hash="h", now=NOW, lease_expires_at=NOW + 30)
    writes = [
        SuccessWrite(s, t, s.key.encode(), NOW + 60) for s, t in zip(batch, tokens, strict=True)
    ]
    writes.append(SuccessWrite(other, lone.record.fencing_token, b"single", NOW + 60))
    assert rstore.mark_success_many(writes, now=NOW + 1) == [True] * 4
    for scope in [*batch, other]:
        got = rstore.get(scope)
        assert got is not None and got.status is Status.SUCCESS
        assert got.response == scope.key.encode()
