"""A body of three recorded steps for the real-worker crash tests (Celery and Dramatiq worker
subprocesses import it).

Each step's external effect appends the worker's pid to ``effect-<step>`` in the directory
the test owns, so the test counts how often each effect really happened.  The first attempt
of a key stops after its second step — it writes ``held-<key>`` and blocks until the test
SIGKILLs its worker — and later attempts of the key run through.  ``reconcile`` answers from
the key's first word (``done-…``, ``notdone-…``, ``unknown-…``), as a lookup at the other
service would, and notes each question in ``reconciled``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from idempotent_tasks import IdempotencyContext, Reconciled, current_context

STEPS = ("charge", "email", "ledger")
#: What ``reconcile`` answers ``done`` with: the result the crashed attempt would have had.
RECONCILED_RESULT = ["charge found at the processor"]


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:  # one O_APPEND write per line
        f.write(line + "\n")


def effect(workdir: Path, name: str) -> str:
    """The external effect of step ``name`` (a card charged, an e-mail sent, a ledger row)."""
    _append(workdir / f"effect-{name}", str(os.getpid()))
    return f"{name} done"


def three_steps(workdir: Path) -> list[Any]:
    """Charge, e-mail, ledger — each a recorded step; the first attempt dies after the e-mail."""
    ctx = current_context()
    assert ctx is not None and ctx.key is not None
    results = []
    for name in STEPS:
        results.append(ctx.step(name, effect, workdir, name))
        if name == "email":
            _hold_the_first_attempt(workdir / f"held-{ctx.key}")
    return results


def _hold_the_first_attempt(marker: Path) -> None:
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    threading.Event().wait()  # "after the second step": the test SIGKILLs the worker here


def fenced_steps(workdir: Path) -> list[Any]:
    """Charge, e-mail, ledger; the first attempt's e-mail step stops *inside* its effect
    (``inside-<key>`` written, then it reads the FIFO ``go-<key>`` the test made): the test
    freezes that worker past its lease and lets another take the scope over."""
    ctx = current_context()
    assert ctx is not None and ctx.key is not None
    charged = ctx.step("charge", effect, workdir, "charge")
    emailed = ctx.step("email", _email_once_held, workdir, ctx.key)
    return [charged, emailed, ctx.step("ledger", effect, workdir, "ledger")]


def _email_once_held(workdir: Path, key: str) -> str:
    marker = workdir / f"inside-{key}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        (workdir / f"go-{key}").read_bytes()  # a FIFO: blocks until the test opens it
    effect(workdir, "email")
    return f"email done by {os.getpid()}"


def reconcile_for(workdir: Path) -> Any:
    """The operation's ``reconcile``: the answer the key names."""

    def reconcile(ctx: IdempotencyContext) -> Reconciled:
        answer = str(ctx.key).split("-", 1)[0]
        _append(workdir / "reconciled", answer)
        if answer == "done":
            return Reconciled.done(RECONCILED_RESULT)
        if answer == "notdone":
            return Reconciled.not_done()
        return Reconciled.unknown(f"the processor has no charge {ctx.derived_key('charge')}")

    return reconcile


def counted(workdir: Path) -> dict[str, int]:
    """How often each step's effect happened."""
    return {
        name: len(p.read_text().splitlines()) if (p := workdir / f"effect-{name}").exists()
        else 0
        for name in STEPS
    }


def held_by(workdir: Path, key: str) -> int | None:
    """The pid of the worker holding ``key``'s first attempt after its second step."""
    marker = workdir / f"held-{key}"
    return int(marker.read_text()) if marker.exists() and marker.read_text() else None


def inside_by(workdir: Path, key: str) -> int | None:
    """The pid of the worker stopped inside ``key``'s e-mail step (``fenced_steps``)."""
    marker = workdir / f"inside-{key}"
    return int(marker.read_text()) if marker.exists() and marker.read_text() else None
