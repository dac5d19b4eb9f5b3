"""The FastAPI example runs as documented: real Redis broker, SQLite store, in-process worker."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import dramatiq
import dramatiq.broker
import httpx
import pytest

from .._services import REDIS_URL, require
from ._apps import ASGIDriver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_payments" / "app.py"


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    require("redis")
    monkeypatch.setenv("STORE_URL", f"sqlite:///{tmp_path / 'idem.db'}")
    monkeypatch.setenv("BROKER_URL", REDIS_URL)
    previous = dramatiq.broker.global_broker
    name = f"fastapi_payments_example_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        module.broker.flush_all()
        module.broker.close()
        module.store.close()
        dramatiq.broker.global_broker = previous
        sys.modules.pop(name, None)


def test_example_replays_payments_and_sends_one_receipt(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = ASGIDriver(example.app)
    key = str(uuid.uuid4())
    auth = {"authorization": "Bearer sk_test_acme"}
    body = {"amount_cents": 1000, "currency": "EUR", "email": "a@example.com"}

    def pay(json: object, key: str | None = key, headers: dict[str, str] = auth) -> httpx.Response:
        async def go() -> httpx.Response:
            async with driver.client() as client:
                return await client.post("/payments", json=json, headers={
                    **headers, **({"idempotency-key": key} if key else {})})

        return asyncio.run(go())

    first, second = pay(body), pay(body)
    assert first.status_code == second.status_code == 201
    assert first.content == second.content
    assert second.headers["idempotent-replayed"] == "true"
    assert pay({**body, "amount_cents": 1}).status_code == 409
    assert pay(body, key=None).status_code == 400
    assert pay(body, key=str(uuid.uuid4()), headers={}).status_code == 400
    bad_key = str(uuid.uuid4())
    assert pay({**body, "amount_cents": 0}, key=bad_key).status_code == 422
    assert pay({**body, "amount_cents": 0}, key=bad_key).status_code == 409

    worker = dramatiq.Worker(example.broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        example.broker.join("payments_example", timeout=20_000)
        worker.join()
    finally:
        worker.stop()
    assert capsys.readouterr().out.count("receipt for pay_") == 1
