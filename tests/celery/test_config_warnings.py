"""``check_configuration``'s risks reach a real ``celery worker``'s log.

A worker imports the app (and ``setup`` runs) before Celery configures logging, so a warning
logged then is lost; the integration reports the risks once logging is set up
(``after_setup_logger``, or ``worker_ready`` when the application handles logging itself), as a
``celery_config_risk`` log line and a ``ConfigurationRiskWarning``.  The worker runs on the
Redis broker with a 10 s lease and no heartbeat — the configuration with which a 25 s task ran
three times without a word in the log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest
from celery import Celery

from idempotent_tasks import IdempotencyHandler, MemoryStore
from idempotent_tasks.celery import check_configuration, setup
from idempotent_tasks.celery._risks import ConfigurationRiskWarning

from .._services import REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
RISK_LINE = "celery_config_risk risk='lease_may_expire_while_running'"
WARNING = "ConfigurationRiskWarning: lease_may_expire_while_running"


def run_worker(profile: str, workdir: Path) -> tuple[str, str]:
    """Start ``celery worker`` (logging to a file), wait until it is ready, stop it; returns
    (its log file, its stderr)."""
    logfile, errfile = workdir / "worker.log", workdir / "stderr.txt"
    queue = f"it_risk_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IT_PROFILE": profile,
           "IT_BROKER_URL": REDIS_URL.rsplit("/", 1)[0] + "/4", "IT_QUEUE": queue}
    command = [sys.executable, "-m", "celery", "-A", "tests.celery.risky_app", "worker",
               "--pool", "solo", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
               "--without-heartbeat", "-Q", queue]
    if profile != "custom_logging":
        command += ["--logfile", str(logfile)]
    with errfile.open("wb") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=err, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "ready." not in _read(logfile) + _read(errfile):
            assert proc.poll() is None, f"the worker exited: {_read(errfile)[-3000:]}"
            assert time.monotonic() < deadline, f"the worker never got ready: {_read(errfile)}"
            time.sleep(0.1)  # polling the worker's output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    return _read(logfile), _read(errfile)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.redis
def test_the_risk_reaches_the_worker_log_through_celery_logging(tmp_path: Path) -> None:
    require("redis")
    log, stderr = run_worker("risky", tmp_path)
    lines = [line for line in log.splitlines() if RISK_LINE in line]
    assert len(lines) == 1, log  # reported once, through Celery's handler and format
    assert "WARNING/MainProcess" in lines[0] and "lease_timeout=10.0" in lines[0]
    assert "risk='acks_early_loses_crashed_tasks'" in log  # the app's tasks were all seen
    assert WARNING in stderr  # the Python warning, on the worker's stderr


@pytest.mark.redis
def test_the_risk_is_reported_when_the_application_sets_up_logging_itself(
    tmp_path: Path,
) -> None:
    require("redis")
    _, output = run_worker("custom_logging", tmp_path)
    lines = [line for line in output.splitlines() if RISK_LINE in line]
    assert len(lines) == 1, output
    assert lines[0].startswith("APPLOG WARNING idempotent_tasks")  # the application's format
    assert WARNING in output


@pytest.mark.redis
def test_a_safe_configuration_reports_nothing(tmp_path: Path) -> None:
    require("redis")
    log, stderr = run_worker("safe", tmp_path)
    assert "ready." in log
    assert "celery_config_risk" not in log + stderr
    assert "ConfigurationRiskWarning" not in stderr


def test_check_configuration_warns_with_the_risk_category() -> None:
    app = Celery("warned", broker="redis://127.0.0.1:6379/4", set_as_current=False)
    setup(app, IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=10), beat=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_configuration(app) == ["lease_may_expire_while_running"]
    assert [type(w.message) for w in caught] == [ConfigurationRiskWarning]
    assert issubclass(ConfigurationRiskWarning, UserWarning)
    assert str(caught[0].message).startswith("lease_may_expire_while_running: lease_timeout=10.0")


def test_setup_alone_reports_nothing_before_a_worker_sets_up_logging() -> None:
    app = Celery("quiet", broker="redis://127.0.0.1:6379/4", set_as_current=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = setup(app, IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=10),
                      beat=False)
        assert app.conf.broker_url  # configures the app (on_after_configure)
    assert caught == []
    assert state.risks == ["lease_may_expire_while_running"]  # computed, for the worker


def test_a_hard_time_limit_that_acks_the_message_is_a_risk() -> None:
    """An idempotent task is requeued on a hard time limit (``acks_on_timeout=False``); a task
    that asks Celery to ack it then (or a Celery that always does) loses the killed attempt's
    message: reported."""
    from idempotent_tasks.celery import IdempotentTask

    app = Celery("limits", broker="redis://127.0.0.1:6379/4", set_as_current=False)
    setup(app, IdempotencyHandler(MemoryStore(), metrics=None, lease_timeout=10,
                                  heartbeat_interval=2), beat=False)

    @app.task(base=IdempotentTask, name="limits.requeued", shared=False, time_limit=5)
    def requeued() -> None: ...

    @app.task(base=IdempotentTask, name="limits.acked", shared=False, time_limit=5,
              acks_on_timeout=True, acks_on_failure_or_timeout=True)
    def acked() -> None: ...

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        risks = check_configuration(app)
    assert "hard_time_limit_drops_task" in risks
    from idempotent_tasks.celery._risks import find_risks

    flagged = [fields["task"] for name, fields in find_risks(app)
               if name == "hard_time_limit_drops_task"]
    import celery

    if hasattr(celery.Task, "acks_on_timeout"):
        assert flagged == ["limits.acked"]
    else:
        assert sorted(flagged) == ["limits.acked", "limits.requeued"]
