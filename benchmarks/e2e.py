"""End-to-end Celery and Dramatiq throughput through RabbitMQ, with and without the library.

Each run pre-publishes ``n`` trivial tasks to a queue of its own, waits until the broker holds
them all, then starts a real worker in this process (Celery: ``start_worker`` with the
``threads`` pool and concurrency 1, one task at a time — the ``solo`` pool stalls in kombu's
event loop, see ``DrainTimer``;
Dramatiq: ``dramatiq.Worker`` with 2 threads) and times the drain from the first task's start
to the last task's end (Celery ``task_prerun``/``task_postrun`` signals; a Dramatiq
middleware's ``before/after_process_message``), so worker start-up and publishing are
excluded.  The variants (plain task, idempotent task on each store) alternate within each
round; figures are medians over the rounds.  Each round also measures the store's raw
claim + complete floor (``floors.py``), so the library's cost per task,
``1/throughput_with - 1/throughput_without``, is compared with a floor of the same moment.
A last variant runs a *plain* task/actor whose body calls ``handler.execute()`` itself (first
store only): the handler and store inside the worker without the integration layer, which
splits the cost between the two.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ._services import POSTGRES_URL, RABBITMQ_URL, REDIS_URL
from ._timing import interleave
from .core import make_handler, open_store
from .floors import floor_ops

PIKA_URL = RABBITMQ_URL[:-2] + "/%2F"
#: Stalls per run (see ``DrainTimer``), for the report.
STALLS: list[int] = []
TENANT = "bench"


#: A gap between two task ends longer than this is a poll-loop stall, not work (see below).
STALL_S = 0.05


class DrainTimer:
    """First start → last end over ``n`` tasks; ``done`` is set at the ``n``-th end.

    In-process Celery workers on RabbitMQ occasionally sit idle in kombu's event loop with
    messages already read into the client's buffer (solo pool: 1 s gaps, and a permanent
    stall with ``worker_prefetch_multiplier=1``; threads pool: 0.1 s gaps), whatever the task
    does.  Gaps longer than ``STALL_S`` are therefore left out of the busy time and counted
    (``stalls``), for both variants alike.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.first = 0.0
        self.ends: list[float] = []
        self.done = threading.Event()
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.ends)

    def start(self, *_: Any, **__: Any) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def end(self, *_: Any, **__: Any) -> None:
        with self._lock:
            self.ends.append(time.perf_counter())
            if len(self.ends) >= self.n:
                self.done.set()

    def gaps(self) -> list[float]:
        times = [self.first, *sorted(self.ends)]
        return [b - a for a, b in itertools.pairwise(times)]

    def stalls(self) -> int:
        return sum(1 for g in self.gaps() if g >= STALL_S)

    def rate(self) -> float:
        busy = sum(g for g in self.gaps() if g < STALL_S)
        return self.n / busy


class Direct:
    """A store used by a *plain* task/actor whose body calls ``handler.execute()`` itself:
    the handler and store inside the worker, without the integration layer."""

    def __init__(self, store: Any) -> None:
        self.store = store


def _direct_body(store: Any, operation: str) -> Callable[[int], None]:
    from .core import _body

    handler = make_handler(store)
    tag = uuid.uuid4().hex[:8]

    def body(i: int) -> None:
        handler.execute(_body, operation=operation, tenant=TENANT, key=f"{tag}-{i}",
                        payload={"args": [i], "kwargs": {}})

    return body


# --------------------------------------------------------------------------- Celery
def celery_drain(n: int, store: Any | None, acks_late: bool = False) -> float:
    """Tasks/s of one solo worker draining ``n`` pre-published tasks.  Idempotent tasks
    default to ``acks_late=True`` (crash safety); ``acks_late`` gives the plain task the same
    setting, so the library's own cost can be told apart from the late ack's."""
    from celery import Celery, signals
    from celery.contrib.testing.worker import start_worker

    tag = uuid.uuid4().hex[:8]
    queue = f"bench-celery-{tag}"
    app = Celery(f"bench_{tag}", broker=RABBITMQ_URL, set_as_current=False)
    app.conf.update(
        task_default_queue=queue, broker_heartbeat=0, task_ignore_result=True,
        worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
    )
    task = _celery_task(app, store, acks_late)
    timer = DrainTimer(n)
    signals.task_prerun.connect(timer.start, sender=task, weak=False)
    signals.task_postrun.connect(timer.end, sender=task, weak=False)
    try:
        for i in range(n):
            if store is None or isinstance(store, Direct):
                task.apply_async((i,))
            else:
                task.apply_async((i,), idempotency_key=f"{tag}-{i}", tenant=TENANT)
        _wait_depth(lambda: _celery_depth(app, queue), n)
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                          shutdown_timeout=10, loglevel="CRITICAL"):
            if not timer.done.wait(60 + n / 100):
                raise TimeoutError(f"celery drained {timer.count}/{n} tasks")
        STALLS.append(timer.stalls())
        return timer.rate()
    finally:
        signals.task_prerun.disconnect(timer.start, sender=task)
        signals.task_postrun.disconnect(timer.end, sender=task)
        with contextlib.suppress(Exception), app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


def _celery_depth(app: Any, queue: str) -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def _wait_depth(depth: Callable[[], int], n: int, timeout: float = 30.0) -> None:
    """Wait until the broker has enqueued all ``n`` messages: a worker started earlier would
    catch up with the publisher and stall in its poll loop (seen: 1 s gaps mid-drain)."""
    deadline = time.monotonic() + timeout
    while depth() < n and time.monotonic() < deadline:
        time.sleep(0.05)


def _celery_task(app: Any, store: Any | None, acks_late: bool) -> Any:
    if store is None:
        @app.task(name="bench.plain", shared=False, acks_late=acks_late,
                  reject_on_worker_lost=acks_late)
        def plain(i: int) -> dict[str, int]:
            return {"ok": i}

        return plain
    if isinstance(store, Direct):
        body = _direct_body(store.store, "bench.direct")

        @app.task(name="bench.direct", shared=False, acks_late=True, reject_on_worker_lost=True)
        def direct(i: int) -> None:
            body(i)

        return direct
    from idempotent_tasks.celery import IdempotentTask, setup

    setup(app, make_handler(store), beat=False)

    @app.task(base=IdempotentTask, name="bench.idempotent", shared=False)
    def idempotent(i: int) -> dict[str, int]:
        return {"ok": i}

    return idempotent


# --------------------------------------------------------------------------- Dramatiq
def dramatiq_drain(n: int, store: Any | None, acks_late: bool = False) -> float:
    """Messages/s of one in-process Dramatiq worker (2 threads) draining ``n`` messages
    (Dramatiq always acks after processing: ``acks_late`` changes nothing)."""
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    tag = uuid.uuid4().hex[:8]
    queue = f"bench-dramatiq-{tag}"
    broker = RabbitmqBroker(url=PIKA_URL)
    timer = DrainTimer(n)
    broker.add_middleware(_timer_middleware(timer))
    actor = _dramatiq_actor(broker, queue, store)
    worker = None
    try:
        for i in range(n):
            if store is None or isinstance(store, Direct):
                actor.send(i)
            else:
                actor.send_with_options(args=(i,), idempotency_key=f"{tag}-{i}", tenant=TENANT)
        _wait_depth(lambda: int(broker.get_queue_message_counts(queue)[0]), n)
        worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
        worker.start()
        if not timer.done.wait(60 + n / 100):
            raise TimeoutError(f"dramatiq drained {timer.count}/{n} messages")
        STALLS.append(timer.stalls())
        return timer.rate()
    finally:
        if worker is not None:
            worker.stop()
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            with contextlib.suppress(Exception):
                broker.channel.queue_delete(name)
        broker.close()


def _timer_middleware(timer: DrainTimer) -> Any:
    from dramatiq.middleware import Middleware

    class Timer(Middleware):
        def before_process_message(self, broker: Any, message: Any) -> None:
            timer.start()

        def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                                  exception: BaseException | None = None) -> None:
            timer.end()

        def after_skip_message(self, broker: Any, message: Any) -> None:
            timer.end()

    return Timer()


def _dramatiq_actor(broker: Any, queue: str, store: Any | None) -> Any:
    import dramatiq

    def work(i: int) -> None:
        """Trivial; returns None (no Results middleware here, and Dramatiq logs a warning for
        every non-None result it has to discard)."""

    if store is None:
        return dramatiq.actor(work, broker=broker, queue_name=queue, actor_name="bench_plain")
    if isinstance(store, Direct):
        return dramatiq.actor(_direct_body(store.store, "bench.direct"), broker=broker,
                              queue_name=queue, actor_name="bench_direct")
    from idempotent_tasks.dramatiq import IdempotencyMiddleware, idempotent_actor

    broker.add_middleware(IdempotencyMiddleware(make_handler(store), maintenance=False))
    return idempotent_actor(work, broker=broker, queue_name=queue, actor_name="bench_idem")


# --------------------------------------------------------------------------- runner
FRAMEWORKS: dict[str, Callable[[int, Any, bool], float]] = {
    "celery": celery_drain,
    "dramatiq": dramatiq_drain,
}


@contextlib.contextmanager
def _stores(kinds: list[str], workdir: Path) -> Iterator[dict[str, Any]]:
    with contextlib.ExitStack() as stack:
        yield {k: stack.enter_context(open_store(k, workdir)) for k in kinds}


def _floor_us(kind: str, workdir: Path, n: int) -> float:
    with floor_ops(kind, workdir, POSTGRES_URL, REDIS_URL) as ops:
        return interleave({"floor": ops["claim+complete"]}, n).median("floor")


def run(n: int, rounds: int, kinds: list[str]) -> dict[str, Any]:
    """{framework: {variant: {"rates": [...], "median": x}}, "floors": {kind: µs}} + costs."""
    STALLS.clear()
    out: dict[str, Any] = {"n": n, "rounds": rounds, "floors": {}}
    floors: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp, _stores(kinds, Path(tmp)) as stores:
        for name, drain in FRAMEWORKS.items():
            direct = {f"{k} (plain task calling execute())": Direct(stores[k]) for k in kinds[:1]}
            variants = ["none", *(["none (acks_late)"] if name == "celery" else []), *kinds,
                        *direct]
            rates: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(rounds):
                for variant, values in rates.items():
                    late = variant == "none (acks_late)"
                    values.append(drain(n, stores.get(variant) or direct.get(variant), late))
                for kind in kinds:
                    floors[kind].append(_floor_us(kind, Path(tmp), 300))
            out[name] = {v: {"rates": [round(r, 1) for r in rs], "median": statistics.median(rs)}
                         for v, rs in rates.items()}
    out["floors"] = {k: round(statistics.median(v), 2) for k, v in floors.items()}
    out["stalls_excluded"] = sum(STALLS)
    for name in FRAMEWORKS:
        _costs(out[name], kinds, out["floors"])
    return out


def _costs(rows: dict[str, Any], kinds: list[str], floors: dict[str, float]) -> None:
    """Cost per task vs the plain task (and, for Celery, vs the plain ``acks_late`` task)."""
    for base_name in ("none", "none (acks_late)"):
        if base_name not in rows:
            continue
        base = rows[base_name]["median"]
        suffix = "" if base_name == "none" else "_vs_acks_late"
        for variant, row in rows.items():
            kind = variant.split(" ")[0]
            if kind not in kinds:
                continue
            cost = (1 / row["median"] - 1 / base) * 1e6
            row["cost_us" + suffix] = round(cost, 2)
            row["floor_us"] = floors[kind]
            row["ratio_to_floor" + suffix] = round(cost / floors[kind], 3)
