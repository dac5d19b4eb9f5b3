"""``idempotent-tasks dashboard``: serves ``create_app`` over the ``--store`` on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner
from starlette.testclient import TestClient

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks.cli import cli
from idempotent_tasks.dashboard import TOKEN_ENV


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``uvicorn.run`` was called with (instead of serving)."""
    seen: dict[str, Any] = {}

    def run(app: Any, **kwargs: Any) -> None:
        seen.update(kwargs, app=app)

    monkeypatch.setattr(uvicorn, "run", run)
    return seen


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = SQLStore(url)
    store.create_schema()
    IdempotencyHandler(store, metrics=None).run(lambda: 1, operation="op", tenant="t", key="k")
    store.close()
    return url


def test_it_serves_the_store_on_loopback_by_default(tmp_path: Path, served: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = CliRunner().invoke(cli, ["--store", _store(tmp_path), "dashboard"])
    assert result.exit_code == 0, result.output
    assert (served["host"], served["port"]) == ("127.0.0.1", 8044)
    assert "read-only" in result.output
    page = TestClient(served["app"]).get("/records/t/op/k")
    assert page.status_code == 200 and "SUCCESS" in page.text


def test_host_port_and_the_token_from_the_environment(tmp_path: Path, served: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok")
    result = CliRunner().invoke(cli, ["--store", _store(tmp_path), "dashboard",
                                      "--host", "0.0.0.0", "--port", "9000"])
    assert result.exit_code == 0, result.output
    assert (served["host"], served["port"]) == ("0.0.0.0", 9000)
    assert "actions need the operator token" in result.output
    assert "tok" not in result.output.replace("token", "")


def test_a_store_without_a_schema_exits_5(tmp_path: Path, served: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'none.db'}",
                                      "dashboard"])
    assert result.exit_code == 5
    assert served == {}


def test_the_store_can_follow_the_command(tmp_path: Path, served: dict[str, Any],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``idempotent-tasks dashboard --store URL`` (the store after the command) works too."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = CliRunner().invoke(cli, ["dashboard", "--store", _store(tmp_path), "--port", "0"])
    assert result.exit_code == 0, result.output
    page = TestClient(served["app"]).get("/records/t/op/k")
    assert page.status_code == 200 and "SUCCESS" in page.text
