"""Several OS processes racing on the same keys: each key's body runs exactly once."""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from ._services import POSTGRES_URL, REDIS_URL, require

PROCESSES = 4
KEYS = 40


def _store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        from idempotent_tasks import SQLStore

        return SQLStore(f"sqlite:///{where}")
    if kind == "postgres":
        from idempotent_tasks import SQLStore

        return SQLStore(POSTGRES_URL, table_prefix=where)
    from idempotent_tasks import RedisStore

    return RedisStore(REDIS_URL, prefix=where)


def _worker(kind: str, where: str, effects: str, barrier: Any, worker: int) -> None:
    from idempotent_tasks import ErrorCode, IdempotencyError, IdempotencyHandler

    handler = IdempotencyHandler(_store(kind, where), metrics=None)
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND)

    def body(key: str) -> str:
        os.write(fd, f"{key} {worker}\n".encode())  # one small O_APPEND write: atomic
        return key

    barrier.wait(30)
    order = range(KEYS) if worker % 2 == 0 else reversed(range(KEYS))
    for i in order:
        key = f"k{i}"
        try:
            assert handler.execute(
                lambda key=key: body(key), operation="race", tenant="t", key=key, payload=i
            ) == key
        except IdempotencyError as exc:
            assert exc.code == ErrorCode.REQUEST_IN_PROGRESS, exc
    os.close(fd)


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
def test_processes_race_each_key_runs_once(kind: str, tmp_path: Path) -> None:
    if kind == "postgres":
        require("postgres")
        where = f"race_{uuid.uuid4().hex[:8]}"
    elif kind == "redis":
        require("redis")
        where = f"race:{uuid.uuid4().hex[:8]}"
    else:
        where = str(tmp_path / "race.db")
    store = _store(kind, where)
    store.create_schema()
    effects = tmp_path / "effects.log"
    effects.touch()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [
        ctx.Process(target=_worker, args=(kind, where, str(effects), barrier, w))
        for w in range(PROCESSES)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * PROCESSES
        lines = effects.read_text().split()
        ran = [lines[i] for i in range(0, len(lines), 2)]
        assert sorted(ran) == sorted(f"k{i}" for i in range(KEYS))  # every key once, no double
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        drop = getattr(store, "drop_schema", None)
        if drop is not None:
            drop()
        store.close()
