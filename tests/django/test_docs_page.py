"""docs/django.md as a newcomer walks it: ``django-admin startproject``, the page's files and
settings, ``makemigrations``/``migrate`` (after which Django sees no model change, the
library's app included), ``manage.py check``, a Celery worker started the way the page says,
the page's ``manage.py shell`` code and its request — API client, CSRF enforced — and one
shipment row per order however often each was sent.

Everything runs in subprocesses, as the user's ``manage.py`` would: this test process has
Django configured with the test project already.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .._services import private_vhost, require
from .._wait import budget
from ..test_docs import _AMQP, ROOT, Block, parse_blocks, worker_process

PAGE = ROOT / "docs" / "django.md"
WORKER = "celery -A proj worker --loglevel INFO"

#: The page's request (its ``curl`` line), from an API client that sends no CSRF token.
REQUESTS = textwrap.dedent("""
    from django.test import Client

    client = Client(enforce_csrf_checks=True, HTTP_HOST="localhost")   # as curl localhost:8000
    headers = {"Idempotency-Key": "k-1", "Authorization": "Bearer tok-acme"}
    first, again = (client.post("/orders/o-1", headers=headers) for _ in range(2))
    assert first.status_code == again.status_code == 201, (first.status_code, first.content[:300])
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert client.post("/orders/o-2").status_code == 400   # no token: MISSING_TENANT
""")

#: Waits (bounded) for the worker to have shipped both orders; exactly one row each.
SHIPPED = textwrap.dedent("""
    import time
    from orders.models import Shipment
    from idempotent_tasks.django import get_handler

    def shipped(order_id, operation, key):
        record = get_handler().get_record(operation=operation, tenant="acme", key=key)
        return record is not None and record.status.value == "SUCCESS"

    give_up = time.monotonic() + GIVE_UP_SECONDS
    while not shipped("o-42", "orders.ship_order", "ship-o-42") and time.monotonic() < give_up:
        time.sleep(0.2)
    while Shipment.objects.filter(order__order_id="o-1").count() == 0 \\
            and time.monotonic() < give_up:
        time.sleep(0.2)
    counts = {o: Shipment.objects.filter(order__order_id=o).count() for o in ("o-42", "o-1")}
    assert counts == {"o-42": 1, "o-1": 1}, counts
""").replace("GIVE_UP_SECONDS", repr(budget(90)))  # the test budget, read here: a subprocess runs it


def _blocks() -> list[Block]:
    return parse_blocks(PAGE, PAGE.read_text())


def _run(project: Path, *argv: str) -> str:
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(list(argv), cwd=project, env=env, capture_output=True, text=True,
                          timeout=budget(120), check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _manage(project: Path, *args: str) -> str:
    return _run(project, sys.executable, "manage.py", *args)


def _build(project: Path, amqp_url: str) -> None:
    """The project the page builds: its commands, then its files and settings."""
    _run(project, "django-admin", "startproject", "proj", ".")
    _manage(project, "startapp", "orders")
    for block in _blocks():
        text = _AMQP.sub(amqp_url, block.code)
        if block.file:
            (project / block.file).write_text(text)
        elif "append" in block.directives:
            with (project / block.directives["append"]).open("a") as settings:
                settings.write("\n" + text)


def test_the_django_page_runs_as_written(tmp_path: Path) -> None:
    require("rabbitmq")
    shells = [b for b in _blocks() if "shell" in b.directives]
    assert shells, "docs/django.md lost its manage.py shell block"
    with private_vhost("django_docs") as amqp_url:
        _build(tmp_path, amqp_url)
        _manage(tmp_path, "makemigrations", "orders")
        _manage(tmp_path, "migrate")
        # what every later `migrate` checks: no model of any app (the library's included)
        # has changes without a migration
        assert "No changes detected" in _manage(tmp_path, "makemigrations", "--check",
                                                "--dry-run")
        _manage(tmp_path, "check", "--fail-level", "WARNING")
        with worker_process(shells[0], WORKER, tmp_path):
            for block in shells:
                _manage(tmp_path, "shell", "-c", block.code)
            _manage(tmp_path, "shell", "-c", REQUESTS)
            _manage(tmp_path, "shell", "-c", SHIPPED)
