"""End-to-end Celery and Dramatiq throughput through RabbitMQ, with and without the library.

Each run pre-publishes ``n`` trivial tasks to a queue of its own, waits until the broker holds
them all, then starts a real worker — Celery: a ``celery worker --pool=solo`` process
(``_celery_worker.py``: one task at a time in the consumer's own thread, as the issue's
reference figures and as each child of the default prefork pool runs them); Dramatiq:
``dramatiq.Worker`` with 2 threads in this process — and times the drain from the first
task's start to the last task's end (Celery ``task_prerun``/``task_postrun`` signals in the
worker process; a Dramatiq middleware's ``before/after_process_message``), so worker
start-up and publishing are excluded.  The variants (plain task, idempotent task on each
store) alternate within each round; figures are medians over the rounds.  Each round also
measures the store's raw claim + complete floor (``floors.py``), so the library's cost per
task, ``1/throughput_with - 1/throughput_without``, is compared with a floor of the same
moment.  A last variant runs a *plain* task/actor whose body calls ``handler.execute()``
itself (first store only): the handler and store inside the worker without the integration
layer, which splits the cost between the two.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
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

    Celery workers on RabbitMQ occasionally sit idle in kombu's event loop with messages
    already read into the client's buffer (gaps of 0.1 to 1 s; seen with ``acks_late`` tasks,
    the plain one included, whatever the task does).  Gaps longer than ``STALL_S`` are
    therefore left out of the busy time and counted (``stalls``), for every variant alike.
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


class Floor(Direct):
    """A store next to whose records a *plain* task/actor (``acks_late`` like the idempotent
    one) runs the raw claim + complete floor statements (``floors.attached_floor``): the
    floor's cost measured inside the same worker, broker and machine load as the library's."""


def _floor_body(store: Any) -> Callable[[int], None]:
    from .floors import attached_floor

    spec = _store_spec(store)
    return attached_floor(spec["kind"], spec["prefix"],
                          POSTGRES_URL if spec["kind"] == "postgresql" else REDIS_URL)


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
    """Tasks/s of one ``celery worker --pool=solo`` process draining ``n`` pre-published
    tasks (``_celery_worker.py``).  Idempotent tasks default to ``acks_late=True`` (crash
    safety); ``acks_late`` gives the plain task the same setting, so the library's own cost
    can be told apart from the late ack's."""
    from celery import Celery

    from idempotent_tasks.celery import KEY_HEADER, TENANT_HEADER

    tag = uuid.uuid4().hex[:8]
    queue = f"bench-celery-{tag}"
    app = Celery(f"bench_{tag}", broker=RABBITMQ_URL, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    direct = isinstance(store, Direct)
    name = ("bench.plain" if store is None else "bench.floor" if isinstance(store, Floor)
            else "bench.direct" if direct else "bench.idempotent")
    try:
        with app.producer_or_acquire() as producer:
            for i in range(n):
                headers = {} if store is None or direct else {
                    KEY_HEADER: f"{tag}-{i}", TENANT_HEADER: TENANT,
                }
                app.send_task(name, (i,), queue=queue, headers=headers, producer=producer)
        _wait_depth(lambda: _celery_depth(app, queue), n)
        config = {
            "n": n, "queue": queue, "broker": RABBITMQ_URL, "acks_late": acks_late,
            "wrapper": type(store).__name__ if direct else None,
            "store": None if store is None else _store_spec(store),
        }
        timer = _run_worker_process(config, timeout=60 + n / 100)
        STALLS.append(timer.stalls())
        return timer.rate()
    finally:
        with contextlib.suppress(Exception), app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


def _store_spec(store: Any) -> dict[str, str]:
    """How the worker process attaches to ``store`` (``_celery_worker.attach_store``)."""
    inner = store.store if isinstance(store, Direct) else store
    if hasattr(inner, "table_prefix"):
        return {"kind": "postgresql", "prefix": inner.table_prefix}
    return {"kind": "redis", "prefix": inner.prefix}


def _run_worker_process(config: dict[str, Any], timeout: float) -> DrainTimer:
    """Start ``_celery_worker`` with ``config``; its drain times once it has run them all."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        log = Path(tmp) / "worker.log"
        with log.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks._celery_worker",
                 json.dumps({**config, "out": str(out)})],
                cwd=Path(__file__).resolve().parent.parent, stdout=log_file, stderr=log_file,
            )
            deadline = time.monotonic() + timeout
            try:
                while not out.exists():
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"celery worker process ended or timed out before draining "
                            f"{config['n']} tasks:\n{log.read_text()[-2000:]}"
                        )
                    time.sleep(0.01)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        data = json.loads(out.read_text())
    timer = DrainTimer(config["n"])
    timer.first = data["first"]
    timer.ends = data["ends"]
    return timer


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
    if isinstance(store, Floor):
        floor = _floor_body(store.store)

        @app.task(name="bench.floor", shared=False, acks_late=True, reject_on_worker_lost=True)
        def run_floor(i: int) -> None:
            floor(i)

        return run_floor
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
    if isinstance(store, Floor):
        return dramatiq.actor(_floor_body(store.store), broker=broker, queue_name=queue,
                              actor_name="bench_floor")
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
            direct: dict[str, Direct] = {
                f"{k} (plain task calling execute())": Direct(stores[k]) for k in kinds[:1]
            }
            direct.update({f"{k}{FLOOR_SUFFIX}": Floor(stores[k]) for k in kinds})
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


FLOOR_SUFFIX = " floor (plain task running the floor statements)"


def _costs(rows: dict[str, Any], kinds: list[str], floors: dict[str, float]) -> None:
    """Cost per task vs the plain task (and, for Celery, vs the plain ``acks_late`` task),
    compared with two floors: the claim + complete floor timed in a loop (``floors``), and
    the same statements run by a plain task in the same worker (``FLOOR_SUFFIX`` rows:
    same broker traffic, worker and machine load as the library's tasks)."""
    for base_name in ("none", "none (acks_late)"):
        if base_name not in rows:
            continue
        base = rows[base_name]["median"]
        suffix = "" if base_name == "none" else "_vs_acks_late"
        for variant, row in rows.items():
            if _kind(variant, kinds) is not None:
                row["cost_us" + suffix] = round((1 / row["median"] - 1 / base) * 1e6, 2)
    for variant, row in rows.items():
        kind = _kind(variant, kinds)
        if kind is None or variant.endswith(FLOOR_SUFFIX):
            continue
        row["floor_us"] = floors[kind]
        row["ratio_to_floor"] = round(row["cost_us"] / floors[kind], 3)
        if "cost_us_vs_acks_late" in row:
            row["ratio_to_floor_vs_acks_late"] = round(
                row["cost_us_vs_acks_late"] / floors[kind], 3)
        worker_floor = rows[f"{kind}{FLOOR_SUFFIX}"]["cost_us"]
        row["worker_floor_us"] = worker_floor
        row["ratio_to_worker_floor"] = round(row["cost_us"] / worker_floor, 3)


def _kind(variant: str, kinds: list[str]) -> str | None:
    return next((k for k in kinds if variant == k or variant.startswith(k + " ")), None)
