"""Every CLI command against SQLite and PostgreSQL (seeded in conftest), in-process."""

from __future__ import annotations

import json
import logging
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from idempotent_tasks import Poison, Status
from idempotent_tasks._core.records import Scope
from idempotent_tasks.cli import (
    EXIT_CONFIGURATION,
    EXIT_RECORD_NOT_FOUND,
    EXIT_STORE_UNAVAILABLE,
    EXIT_USAGE,
    cli,
    main,
)
from idempotent_tasks.cli._app import cli_logging
from idempotent_tasks.cli._render import ago, duration
from idempotent_tasks.testing import simulate_crash

from .._services import POSTGRES_URL, require
from ..conftest import unique_prefix
from .conftest import OP, OTHER_OP, OTHER_TENANT, PAST, TENANT, Seeded


def _json(result) -> dict:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------- migrate
def test_migrate_is_idempotent(seeded: Seeded) -> None:
    for _ in range(2):
        result = seeded.run("migrate")
        assert result.exit_code == 0, result.output
        assert "schema ready" in result.stdout
    assert seeded.store.get(Scope(TENANT, OP, "k-success")) is not None  # data untouched


def test_migrate_creates_tables_on_an_empty_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert CliRunner().invoke(cli, ["--store", url, "migrate"]).exit_code == 0
    result = CliRunner().invoke(cli, ["--store", url, "stats", "--json"])
    assert _json(result)["total"] == 0


# ------------------------------------------------------------------------------- inspect
def test_inspect_json_has_record_counter_and_both_timestamp_forms(seeded: Seeded) -> None:
    doc = _json(seeded.run("inspect", TENANT, OP, "k-poisoned", "--json"))
    assert (doc["tenant"], doc["operation"], doc["key"]) == (TENANT, OP, "k-poisoned")
    assert doc["status"] == "FAILED"
    assert doc["retry_count"] == 0
    assert len(doc["request_hash"]) == 64
    assert doc["created_at"] == pytest.approx(time.time() - PAST + 1, abs=60)
    assert doc["created_at_iso"].startswith(time.strftime("%Y-", time.gmtime(doc["created_at"])))
    assert doc["created_at_iso"].endswith("+00:00")
    assert doc["expires_at"] > doc["updated_at"]
    assert doc["lease"] is None

    ok = _json(seeded.run("inspect", TENANT, OP, "k-success", "--json"))
    assert ok["status"] == "SUCCESS" and ok["response"] == {"charged": 100}

    stuck = _json(seeded.run("inspect", TENANT, OP, "k-stuck", "--json"))
    assert stuck["status"] == "PROCESSING" and stuck["lease"] == "expired"


def test_inspect_table_shows_fields(seeded: Seeded) -> None:
    result = seeded.run("inspect", TENANT, OP, "k-success")
    assert result.exit_code == 0, result.output
    for text in ("SUCCESS", "k-success", "retry_count", "created_at", '{"charged": 100}', " ago)"):
        assert text in result.stdout


def test_inspect_missing_scope_exits_record_not_found_and_tells_the_counter(
    seeded: Seeded,
) -> None:
    result = seeded.run("inspect", TENANT, OP, "k-flaky")
    assert result.exit_code == EXIT_RECORD_NOT_FOUND == 3
    assert result.stderr.startswith("error: RECORD_NOT_FOUND: ")
    assert "retry counter: 1" in result.stderr
    assert "Traceback" not in result.output

    other_tenant = seeded.run("inspect", OTHER_TENANT, OP, "k-success", "--json")
    assert other_tenant.exit_code == EXIT_RECORD_NOT_FOUND
    assert other_tenant.stdout == ""


def test_inspect_expired_record_counts_as_absent(seeded: Seeded) -> None:
    assert seeded.run("inspect", TENANT, OP, "k-expired").exit_code == EXIT_RECORD_NOT_FOUND


def test_inspect_shows_the_past_attempts_a_new_attempt_replaced(seeded: Seeded) -> None:
    h = seeded.handler()
    scope = {"operation": OP, "tenant": TENANT, "key": "k-retried"}
    poisoned = h.run(_poison("card declined"), on_failure="allow_new_attempt", **scope)
    assert h.run(lambda: "paid", on_failure="allow_new_attempt", **scope).kind == "executed"
    doc = _json(seeded.run("inspect", TENANT, OP, "k-retried", "--json"))
    (attempt,) = doc["attempts"]
    assert (attempt["fencing_token"], attempt["status"], attempt["detail"]) == (
        poisoned.fencing_token, "FAILED", '"card declined"'
    )
    assert attempt["settled_at_iso"].endswith("+00:00")
    table = seeded.run("inspect", TENANT, OP, "k-retried")
    assert table.exit_code == 0, table.output
    assert "past attempts" in table.stdout and '"card declined"' in table.stdout
    plain = seeded.run("inspect", TENANT, OP, "k-success")
    assert "past attempts" not in plain.stdout
    assert _json(seeded.run("inspect", TENANT, OP, "k-success", "--json"))["attempts"] == []


def _poison(kept: str):  # type: ignore[no-untyped-def]
    def body() -> None:
        raise Poison(result=kept)

    return body


def test_invalid_key_is_a_usage_error(seeded: Seeded) -> None:
    result = seeded.run("inspect", TENANT, OP, "bad\x00key")
    assert result.exit_code == EXIT_USAGE
    assert "error: INVALID_KEY" in result.stderr


# ------------------------------------------------------------------------------- list
def test_list_filters_and_pages(seeded: Seeded) -> None:
    everything = _json(seeded.run("list", "--json"))
    keys = [r["key"] for r in everything["records"]]
    # oldest first; k-flaky has no record
    assert keys == ["k-success", "k-poisoned", "k-stuck", "k-expired", "k-other"]
    assert everything["next_offset"] is None
    expired = next(r for r in everything["records"] if r["key"] == "k-expired")
    assert expired["expired"] is True

    page1 = _json(seeded.run("list", "--limit", "2", "--json"))
    page2 = _json(seeded.run("list", "--limit", "2", "--offset", "2", "--json"))
    assert [r["key"] for r in page1["records"]] == keys[:2]
    assert page1["next_offset"] == 2
    assert [r["key"] for r in page2["records"]] == keys[2:4]

    failed = _json(seeded.run("list", "--status", "failed", "--json"))
    assert [(r["key"], r["status"]) for r in failed["records"]] == [("k-poisoned", "FAILED")]
    by_op = _json(seeded.run("list", "--operation", OTHER_OP, "--json"))
    assert [r["key"] for r in by_op["records"]] == ["k-other"]
    by_tenant = _json(seeded.run("list", "--tenant", OTHER_TENANT, "--json"))
    assert [r["tenant"] for r in by_tenant["records"]] == [OTHER_TENANT]


def test_list_table_and_next_page_hint(seeded: Seeded) -> None:
    result = seeded.run("list", "--limit", "3")
    assert result.exit_code == 0, result.output
    assert "k-success" in result.stdout and "k-stuck" in result.stdout
    assert "k-other" not in result.stdout
    assert "--offset 3" in result.stdout
    empty = seeded.run("list", "--tenant", "nobody")
    assert empty.exit_code == 0 and "no records match" in empty.stdout


def test_list_rejects_an_unknown_status(seeded: Seeded) -> None:
    assert seeded.run("list", "--status", "DONE").exit_code == EXIT_USAGE


# ------------------------------------------------------------------------------- stats
def test_stats_counts_by_operation_and_status(seeded: Seeded) -> None:
    doc = _json(seeded.run("stats", "--json"))
    assert doc["by_operation"] == {
        OP: {"PROCESSING": 1, "SUCCESS": 2, "FAILED": 1, "UNCERTAIN": 0},
        OTHER_OP: {"PROCESSING": 0, "SUCCESS": 1, "FAILED": 0, "UNCERTAIN": 0},
    }
    assert doc["by_status"] == {"PROCESSING": 1, "SUCCESS": 3, "FAILED": 1, "UNCERTAIN": 0}
    assert doc["total"] == 5
    table = seeded.run("stats")
    assert table.exit_code == 0 and OP in table.stdout and OTHER_OP in table.stdout


# ------------------------------------------------------------------------------- recover
def test_recover_dry_run_changes_nothing_then_recover_releases(seeded: Seeded) -> None:
    dry = _json(seeded.run("recover", "--dry-run", "--json"))
    assert dry["would_recover"] == 1
    (stuck,) = dry["records"]
    assert stuck["key"] == "k-stuck" and stuck["lease"] == "expired"
    assert stuck["action"].startswith("release for redelivery (attempt 1/3)")
    table = seeded.run("recover", "--dry-run")
    assert "k-stuck" in table.stdout and "would recover 1" in table.stdout
    record = seeded.store.get(Scope(TENANT, OP, "k-stuck"))
    assert record is not None and record.status is Status.PROCESSING  # untouched

    # --timeout longer than the record's age: not stuck "enough"
    assert _json(seeded.run("recover", "--dry-run", "--timeout", str(PAST * 2), "--json"))[
        "would_recover"
    ] == 0

    done = _json(seeded.run("recover", "--json"))
    assert done == {"recovered": 1, "batches": 1}
    assert seeded.store.get(Scope(TENANT, OP, "k-stuck")) is None  # released
    assert seeded.store.get_retry_count(Scope(TENANT, OP, "k-stuck")) == 1  # counted
    again = seeded.run("recover")
    assert again.exit_code == 0 and "recovered 0" in again.stdout


def test_recover_dry_run_predicts_poisoning(seeded: Seeded) -> None:
    dry = _json(seeded.run("recover", "--dry-run", "--max-retries", "1", "--json"))
    assert dry["records"][0]["action"].startswith("poison (attempt 1/1)")
    fail = _json(seeded.run("recover", "--dry-run", "--on-stuck", "fail", "--json"))
    assert fail["records"][0]["action"] == "poison (on_stuck=fail)"
    assert _json(seeded.run("recover", "--on-stuck", "fail", "--json"))["recovered"] == 1
    record = seeded.store.get(Scope(TENANT, OP, "k-stuck"))
    assert record is not None and record.status is Status.FAILED


def test_recover_all_repeats_batches(seeded: Seeded) -> None:
    h = seeded.handler()
    for i in range(3):
        simulate_crash(h, operation=OP, tenant=TENANT, key=f"crash-{i}", lease_timeout=0.01)
    time.sleep(0.05)
    done = _json(seeded.run("recover", "--all", "--limit", "2", "--json"))
    assert done == {"recovered": 4, "batches": 3}  # 2 + 2 + an empty last batch


# ------------------------------------------------------------------------------- cleanup
def test_cleanup_dry_run_then_purge(seeded: Seeded) -> None:
    dry = _json(seeded.run("cleanup", "--dry-run", "--json"))
    assert [r["key"] for r in dry["records"]] == ["k-expired"]
    assert dry["would_purge"] == 1
    assert "would purge 1" in seeded.run("cleanup", "--dry-run").stdout
    assert seeded.store.get(Scope(TENANT, OP, "k-expired")) is not None  # untouched

    assert _json(seeded.run("cleanup", "--json")) == {"purged": 1, "batches": 1}
    assert seeded.store.get(Scope(TENANT, OP, "k-expired")) is None
    assert seeded.store.get(Scope(TENANT, OP, "k-success")) is not None
    assert "purged 0" in seeded.run("cleanup").stdout


def test_cleanup_ttl_governs_stale_counters(seeded: Seeded) -> None:
    flaky = Scope(TENANT, OP, "k-flaky")
    assert seeded.store.get_retry_count(flaky) == 1
    assert seeded.run("cleanup").exit_code == 0
    assert seeded.store.get_retry_count(flaky) == 1  # younger than the default ttl (1 day)
    assert seeded.run("cleanup", "--ttl", "60").exit_code == 0
    assert seeded.store.get_retry_count(flaky) == 0


# ------------------------------------------------------------------------------- unpoison
def test_unpoison_resets_and_audits(seeded: Seeded, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="idempotent_tasks")
    result = seeded.run("unpoison", TENANT, OP, "k-poisoned", "--yes", "--actor", "alice")
    assert result.exit_code == 0, result.output
    assert "old state" in result.stdout and "FAILED" in result.stdout
    assert "unpoisoned by cli:alice" in result.stdout
    audit = [r for r in caplog.records if r.getMessage().startswith("unpoisoned")]
    assert len(audit) == 1
    fields = audit[0].idempotency  # type: ignore[attr-defined]
    assert fields["actor"] == "cli:alice"
    assert (fields["tenant"], fields["operation"], fields["key"]) == (TENANT, OP, "k-poisoned")
    assert fields["status"] == "FAILED"
    assert "unpoisoned" in result.stderr  # the CLI shows the audit line on stderr too
    assert seeded.store.get(Scope(TENANT, OP, "k-poisoned")) is None

    h = seeded.handler()
    assert h.execute(lambda: "ran", operation=OP, tenant=TENANT, key="k-poisoned",
                     payload={"amount": 5}) == "ran"


def test_unpoison_json_and_counter_reset(seeded: Seeded) -> None:
    h = seeded.handler()
    for _ in range(3):
        with pytest.raises(RuntimeError):
            h.execute(_boom, operation=OP, tenant=TENANT, key="k-three")
    doc = _json(seeded.run("unpoison", TENANT, OP, "k-three", "-y", "--json"))
    assert doc["unpoisoned"] is True
    assert doc["old"]["status"] == "FAILED" and doc["old"]["retry_count"] == 3
    assert seeded.store.get_retry_count(Scope(TENANT, OP, "k-three")) == 0


def _boom() -> None:
    raise RuntimeError("transient")


def test_unpoison_asks_first(seeded: Seeded) -> None:
    refused = seeded.run("unpoison", TENANT, OP, "k-poisoned", input="n\n")
    assert refused.exit_code == 1
    assert "record to unpoison" in refused.stdout
    record = seeded.store.get(Scope(TENANT, OP, "k-poisoned"))
    assert record is not None and record.status is Status.FAILED
    accepted = seeded.run("unpoison", TENANT, OP, "k-poisoned", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert seeded.store.get(Scope(TENANT, OP, "k-poisoned")) is None


def test_unpoison_refuses_what_is_not_poisoned(seeded: Seeded) -> None:
    ok = seeded.run("unpoison", TENANT, OP, "k-success", "--yes")
    assert ok.exit_code == EXIT_RECORD_NOT_FOUND
    assert "error: RECORD_NOT_FOUND: the scope is SUCCESS, not FAILED" in ok.stderr
    assert seeded.store.get(Scope(TENANT, OP, "k-success")) is not None
    missing = seeded.run("unpoison", TENANT, OP, "nope", "--yes")
    assert missing.exit_code == EXIT_RECORD_NOT_FOUND


# ------------------------------------------------------------------------------- errors
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "redis"])
@pytest.mark.parametrize("command", [["stats"], ["inspect", "t", "op", "k"], ["recover"],
                                     ["list"], ["migrate"]])
def test_store_unavailable_exit_code_without_traceback(scheme: str, command: list[str]) -> None:
    port = _closed_port()
    url = f"{scheme}://postgres@127.0.0.1:{port}/test" if scheme != "redis" else (
        f"redis://127.0.0.1:{port}/0"
    )
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["--store", url, "--log-level", "off", *command])
    assert result.exit_code == EXIT_STORE_UNAVAILABLE == 4, result.output
    assert result.stderr.startswith("error: STORE_UNAVAILABLE: ")
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("command", [["stats"], ["list"], ["inspect", "t", "op", "k"],
                                     ["recover"], ["cleanup", "--dry-run"]])
def test_missing_schema_says_run_migrate_once(
    backend: str, command: list[str], tmp_path: Path
) -> None:
    if backend == "sqlite":
        path = tmp_path / "never-migrated.db"
        sqlite3.connect(path).close()  # a database file with no schema in it
        args = ["--store", f"sqlite:///{path}"]
    else:
        require("postgres")
        args = ["--store", POSTGRES_URL, "--prefix", unique_prefix("nomigrate")]
    result = CliRunner().invoke(cli, [*args, *command])
    assert result.exit_code == EXIT_CONFIGURATION == 5, result.output
    assert result.stderr == (
        "error: CONFIGURATION_ERROR: schema not created: run `idempotent-tasks migrate`\n")
    assert result.stdout == ""


def test_an_error_is_printed_once_not_also_as_a_log_line() -> None:
    """The store's error log line describes the very error the CLI reports: not repeated."""
    result = CliRunner().invoke(cli, ["--store", f"redis://127.0.0.1:{_closed_port()}/0",
                                      "--log-level", "debug", "stats"])
    assert result.exit_code == EXIT_STORE_UNAVAILABLE
    assert result.stderr.startswith("error: STORE_UNAVAILABLE: ")
    assert result.stderr.count("STORE_UNAVAILABLE") == 1
    assert "ERROR idempotent_tasks" not in result.stderr


def test_error_log_lines_of_a_command_that_succeeds_are_still_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Error lines are held until the command ends, and shown when it did not fail."""
    with cli_logging("warning") as handler:
        logging.getLogger("idempotent_tasks").error("store_error call='get'")
        logging.getLogger("idempotent_tasks").warning("recovered")
        assert handler is not None and len(handler.held) == 1
        assert "recovered" in capsys.readouterr().err  # not held
    err = capsys.readouterr().err
    assert "ERROR idempotent_tasks: store_error call='get'" in err


def test_bad_url_is_a_configuration_error() -> None:
    result = CliRunner().invoke(cli, ["--store", "mongodb://x/y", "stats"])
    assert result.exit_code == EXIT_CONFIGURATION == 5
    assert result.stderr.startswith("error: CONFIGURATION_ERROR: unknown store URL scheme")


def test_store_url_from_environment(seeded: Seeded) -> None:
    env = {"IDEMPOTENT_TASKS_STORE": seeded.url, "IDEMPOTENT_TASKS_PREFIX": seeded.prefix}
    result = CliRunner(env=env).invoke(cli, ["stats", "--json"])
    assert _json(result)["total"] == 5


@pytest.mark.parametrize("argv", [["inspect", "only-tenant"], ["no-such-command"],
                                  ["recover", "--limit", "0"], ["--log-level", "loud", "stats"],
                                  ["stats", "--no-such-option"]])
def test_usage_errors_exit_2_with_a_code(argv: list[str]) -> None:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.splitlines()[-1].startswith("error: USAGE: ")
    assert result.stderr.startswith("Usage: ")  # what the command takes comes first


@pytest.mark.parametrize("argv", [["list"], ["stats"], ["inspect", "t", "op", "k"],
                                  ["--store", "mongodb://x/y", "stats"], ["inspect", "t"]])
def test_every_error_line_carries_a_code(argv: list[str], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``error: CODE: message``, as the README promises, whatever went wrong (here: no
    database in the current directory, a bad URL, a missing argument)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IDEMPOTENT_TASKS_STORE", raising=False)
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and re.match(r"error: [A-Z_]+: \S", errors[0]), result.stderr


def test_main_returns_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["--store", url, "migrate"]) == 0
    assert main(["--store", url, "inspect", "t", "op", "k"]) == EXIT_RECORD_NOT_FOUND
    assert "error: RECORD_NOT_FOUND" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "Exit codes" in capsys.readouterr().out


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("idempotent-tasks")
    port = _closed_port()
    proc = subprocess.run(
        [str(exe), "--store", f"postgresql+psycopg://postgres@127.0.0.1:{port}/x", "stats"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert proc.returncode == EXIT_STORE_UNAVAILABLE
    assert "error: STORE_UNAVAILABLE" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("command", [["stats"], ["list"], ["inspect", "t", "op", "k"],
                                     ["recover"], ["cleanup"], ["unpoison", "t", "op", "k"]])
def test_a_missing_sqlite_file_is_not_created(command: list[str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No --store (the default sqlite:///idempotency.db) or a mistyped path: the CLI says
    there is no such database instead of letting SQLite create an empty file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IDEMPOTENT_TASKS_STORE", raising=False)
    default = CliRunner().invoke(cli, command)
    assert default.exit_code == EXIT_CONFIGURATION == 5, default.output
    assert default.stderr == (
        "error: CONFIGURATION_ERROR: no such database: idempotency.db does not exist; "
        "schema not created: run "
        "`idempotent-tasks --store sqlite:///idempotency.db migrate`\n")
    typo = tmp_path / "idempotncy.db"
    mistyped = CliRunner().invoke(cli, ["--store", f"sqlite:///{typo}", "--prefix", "app",
                                        *command])
    assert mistyped.exit_code == 5
    assert mistyped.stderr.startswith(
        f"error: CONFIGURATION_ERROR: no such database: {typo} does not exist")
    assert "--prefix app migrate`" in mistyped.stderr
    assert list(tmp_path.iterdir()) == []


def test_migrate_still_creates_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IDEMPOTENT_TASKS_STORE", raising=False)
    assert CliRunner().invoke(cli, ["migrate"]).exit_code == 0
    assert (tmp_path / "idempotency.db").is_file()
    assert CliRunner().invoke(cli, ["stats"]).exit_code == 0


@pytest.mark.parametrize(("seconds", "text"), [
    (0.4, "0s"), (59.4, "59s"), (59.6, "1m 0s"), (2819.6, "47m 0s"), (2819.4, "46m 59s"),
    (3599.7, "1h 0m"), (7500, "2h 5m"), (86399.9, "1d 0h"), (90000, "1d 1h"),
])
def test_durations_never_show_60_of_a_unit(seconds: float, text: str) -> None:
    assert duration(seconds) == text
    assert ago(1000.0 + seconds, 1000.0) == f"in {text}"
    assert ago(1000.0 - seconds, 1000.0) == f"{text} ago"
