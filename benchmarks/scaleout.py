"""The stores past one machine: ``execute()`` on MariaDB (``SQLStore("mysql+pymysql://…")``)
and on DynamoDB (``DynamoDBStore``), each against its own raw floor, interleaved; and batch
claims on both.

* MariaDB: the machine's server, in a database of the run's own (``idem_bench_<hex>``,
  created and dropped here).  Floor: PyMySQL autocommit ``INSERT`` + conditional ``UPDATE``
  (first delivery), ``INSERT IGNORE`` + ``SELECT`` (replay), on a table the store created.
* DynamoDB: ``moto_server`` (moto's DynamoDB over HTTP, started here on a free port), or the
  endpoint in ``IDEMPOTENT_TASKS_BENCH_DYNAMODB`` (e.g. DynamoDB Local).  Floor: a
  conditional ``PutItem`` + a conditional ``UpdateItem`` (first delivery), the refused
  ``PutItem`` with ``ALL_OLD`` (replay), through a boto3 client like the store's.  moto is
  slow (milliseconds per request) and nothing like the service: read the ratios, never the
  absolute times.

Targets: ≤ 1.5x the SQL floor on MariaDB, ≤ 1.3x the request floor on DynamoDB (as for
PostgreSQL and Redis).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from . import batch
from ._timing import interleave
from .core import _row, ours_ops
from .floors import dynamodb_floor_fns, mysql_floor_fns

MARIADB = "mysql+pymysql://root@127.0.0.1:3306"
KINDS = ("mysql", "dynamodb")


@contextlib.contextmanager
def _mariadb_url() -> Iterator[str]:
    import pymysql

    name = f"idem_bench_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    try:
        yield f"{MARIADB}/{name}"
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@contextlib.contextmanager
def _dynamodb_endpoint() -> Iterator[str]:
    given = os.environ.get("IDEMPOTENT_TASKS_BENCH_DYNAMODB")
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(name, value)
    if given:
        yield given
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("moto_server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def open_store(kind: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A fresh store of ``kind`` and its floor ops, both dropped after."""
    if kind == "mysql":
        from idempotent_tasks import SQLStore

        with _mariadb_url() as url:
            store = SQLStore(url, table_prefix="bench")
            store.create_schema()
            ops, conn = mysql_floor_fns(url, "bench_records")
            try:
                yield store, ops
            finally:
                conn.close()
                store.drop_schema()
                store.close()
        return
    from idempotent_tasks import DynamoDBStore

    with _dynamodb_endpoint() as endpoint:
        store = DynamoDBStore(f"bench-{uuid.uuid4().hex[:8]}", endpoint_url=endpoint,
                              region_name="us-east-1")
        store.create_table()
        try:
            yield store, dynamodb_floor_fns(store.client, store.table_name)
        finally:
            store.drop_table()
            store.close()


def measure_kind(kind: str, n: int) -> dict[str, Any]:
    with open_store(kind) as (store, floor):
        ours = ours_ops(store)
        first = interleave({"floor": floor["claim+complete"], "ours": ours["first delivery"]}, n)
        dup = interleave({"floor": floor["claim-or-get"], "ours": ours["replay (store)"],
                          "in-progress": ours["in-progress rejection"]}, n)
        return {
            "first delivery": _row(first, "claim+complete"),
            "replay (store)": _row(dup, "claim-or-get"),
            "in-progress rejection": _row(dup, "claim-or-get", "in-progress"),
        }


def measure_batch(kind: str, scopes_per_round: int, rounds: int) -> dict[str, Any]:
    """``create_many`` against single ``create`` calls, alternating rounds (batch.py)."""
    import statistics

    with open_store(kind) as (store, _floor):
        batch._many_rate(store, 100, 2)
        samples: dict[str, list[float]] = {"single create": [], "create_many(100)": []}
        for _ in range(rounds):
            samples["single create"].append(batch._single_rate(store, max(scopes_per_round // 10,
                                                                          50)))
            samples["create_many(100)"].append(
                batch._many_rate(store, 100, max(scopes_per_round // 100, 2)))
        medians = {k: round(statistics.median(v)) for k, v in samples.items()}
        return {"scopes_per_s": medians,
                "speedup": round(medians["create_many(100)"] / medians["single create"], 1)}


def run(n: int, scopes_per_round: int, rounds: int) -> dict[str, Any]:
    """Every kind's core rows and batch rates; n is scaled down for moto (ms per request)."""
    from ._services import retry_once

    out: dict[str, Any] = {}
    for kind in KINDS:
        kind_n = n if kind == "mysql" else max(n // 10, 50)
        scopes = scopes_per_round if kind == "mysql" else max(scopes_per_round // 20, 200)
        out[kind] = retry_once(f"scaleout/{kind}", lambda k=kind, m=kind_n: measure_kind(k, m))
        out[kind]["batch"] = retry_once(
            f"scaleout/{kind}/batch", lambda k=kind, s=scopes: measure_batch(k, s, rounds))
        out[kind]["n"] = kind_n
    return out


def table(data: dict[str, Any], console: Console) -> None:
    from .report import _num, _ratio, _table

    t = _table("Stores past one machine: execute() vs each store's own floor (interleaved, "
               "medians; DynamoDB = moto over HTTP: ratios only)",
               ["store", "measure", "ours µs", "floor µs", "floor", "ratio"])
    for kind, rows in data.items():
        for measure in ("first delivery", "replay (store)", "in-progress rejection"):
            row = rows.get(measure, {})
            t.add_row(kind, measure, _num(row.get("ours")), _num(row.get("floor")),
                      row.get("floor_name", "-"), _ratio(row.get("ratio")))
        rates = rows.get("batch", {}).get("scopes_per_s", {})
        t.add_row(kind, "batch claims /s (single → create_many(100))",
                  _num(rates.get("single create"), 0), _num(rates.get("create_many(100)"), 0),
                  "speed-up", f"{rows.get('batch', {}).get('speedup', '-')}x")
    console.print(t)


def targets(report: dict[str, Any]) -> list[dict[str, str]]:
    from .report import _check, _get

    rows = []
    for kind, label, limit in (("mysql", "MariaDB INSERT + UPDATE floor", 1.5),
                               ("dynamodb", "DynamoDB PutItem + UpdateItem floor", 1.3)):
        rows.append(_check(f"first delivery vs {label}",
                           _get(report, "scaleout", kind, "first delivery", "ratio"), limit))
        replay_limit = 1.5 if kind == "mysql" else 1.3
        rows.append(_check(f"replay vs {kind} claim-or-get floor",
                           _get(report, "scaleout", kind, "replay (store)", "ratio"),
                           replay_limit))
    return rows
