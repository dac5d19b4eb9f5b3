"""Run worker processes against one store, inject faults while they run, collect the
histories.

Faults are scheduled by progress (after so many operations, not after so many seconds) and
each one is verified before it is counted:

* ``kill`` — a random worker is SIGKILLed (verified: it died of SIGKILL); whether it was
  inside an operation is read from its history afterwards.
* ``kill_mid_op`` — the store is *stalled* (network stores: every chunk through the proxy
  held 1 s; SQLite: the runner holds the write lock), a worker whose history ends with
  an open invocation of an operation the stall holds, invoked after the stall began, is
  SIGKILLed (verified: SIGKILL, and its history still ends with that invocation), then the
  stall ends.  An operation invoked before the stall may already have its answer and be
  about to record it; one the stall lets through (a SQLite claim of a scope that has a
  record is one read, which WAL mode never blocks) may finish before the kill lands.  Through the proxy the dead worker's request is still
  delivered afterwards: an operation that takes effect after its process died.
* ``drop`` (network stores) — every connection through the proxy is aborted (verified: none
  left open) and the workers reconnect (verified: the proxy accepted new connections).

A killed worker is replaced at once by a spare process started with the others (a new
history: processes are sequential, a replacement is another process).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from tests._wait import wait_until as _wait_until

from .history import READS, Op, load

ROOT = Path(__file__).resolve().parents[2]
NETWORK_PLAN = (
    (0.15, "kill_mid_op"), (0.3, "drop"), (0.45, "kill"), (0.6, "drop"), (0.75, "kill_mid_op"),
)
FILE_PLAN = ((0.2, "kill_mid_op"), (0.4, "kill"), (0.6, "kill_mid_op"), (0.8, "kill"))
_DEADLINE = 120.0  # bound on any wait of a run: a hung run fails, never hangs


class FaultNotVerified(AssertionError):
    pass


@dataclass
class Target:
    """A store as the workers reach it, and the faults it supports."""

    kind: str
    url: str
    prefix: str | None
    stall: Callable[[], AbstractContextManager[None]]
    drop: Callable[[], str] | None = None
    # operations the stall may let through: never the victim of ``kill_mid_op``
    unheld: frozenset[str] = frozenset(READS)

    @property
    def plan(self) -> tuple[tuple[float, str], ...]:
        return NETWORK_PLAN if self.drop is not None else FILE_PLAN


@dataclass
class Worker:
    name: str
    history: Path
    proc: subprocess.Popen[bytes]


@dataclass
class Run:
    target: Target
    workdir: Path
    workers: int = 4
    ops: int = 1200
    keys: int = 3
    seed: int = 1
    think: float = 0.001
    faults: list[str] = field(default_factory=list)
    mid_op_kills: int = 0
    kills: int = 0
    _live: list[Worker] = field(default_factory=list)
    _spares: list[Worker] = field(default_factory=list)
    _all: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.stop_file = self.workdir / "stop"

    # -- workers -----------------------------------------------------------------------------
    def _spawn(self) -> Worker:
        name = f"p{len(self._all)}"
        cfg = {
            "kind": self.target.kind, "url": self.target.url, "prefix": self.target.prefix,
            "process": name, "history": str(self.workdir / f"{name}.jsonl"),
            "seed": self.rng.randrange(2**31), "keys": [f"k{i}" for i in range(self.keys)],
            "stop": str(self.stop_file), "ready": str(self.workdir / f"{name}.ready"),
            "think": self.think,
        }
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.linearizability.workload", json.dumps(cfg)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT,
        )
        worker = Worker(name, Path(cfg["history"]), proc)
        self._all.append(worker)
        return worker

    def _start(self) -> None:
        """Spawn the workers and one spare per kill of the plan; once every one is
        connected, let the workers go together.  A spare replaces a killed worker at once
        (a process takes a second to start; the run would be over by then)."""
        spares = sum(fault.startswith("kill") for _, fault in self.target.plan)
        fresh = [self._spawn() for _ in range(self.workers + spares)]
        for w in fresh:
            ready = self.workdir / f"{w.name}.ready"
            _wait(lambda w=w, ready=ready: ready.exists() or w.proc.poll() is not None,
                  f"{w.name} to connect")
            if w.proc.poll() is not None:
                raise AssertionError(f"{w.name} died: {self._log(w)}")
        self._spares = fresh[self.workers:]
        for w in fresh[: self.workers]:
            self._go(w)

    def _go(self, w: Worker) -> None:
        assert w.proc.stdin is not None
        w.proc.stdin.write(b"go\n")
        w.proc.stdin.close()
        self._live.append(w)

    def _replace(self) -> None:
        self._go(self._spares.pop(0))

    def _log(self, w: Worker) -> str:
        return (self.workdir / f"{w.name}.log").read_text()[-3000:]

    # -- progress ----------------------------------------------------------------------------
    def progress(self) -> int:
        """Operations that ended (completed or failed) so far, over every worker."""
        done = 0
        for w in self._all:
            with contextlib.suppress(FileNotFoundError):
                text = w.history.read_bytes()
                done += text.count(b'"e":"c"') + text.count(b'"e":"x"')
        return done

    def _wait_progress(self, ops: int) -> None:
        def reached() -> bool:
            dead = [w for w in self._live if w.proc.poll() is not None]
            if dead:
                raise AssertionError(f"{dead[0].name} died unasked: {self._log(dead[0])}")
            return self.progress() >= ops
        _wait(reached, f"{ops} operations")

    # -- faults ------------------------------------------------------------------------------
    def _sigkill(self, w: Worker) -> None:
        w.proc.send_signal(signal.SIGKILL)
        code = w.proc.wait(10)
        if code != -signal.SIGKILL:
            raise FaultNotVerified(f"{w.name} exited {code}, not by SIGKILL")
        self._live.remove(w)
        self.kills += 1

    def kill(self) -> None:
        victim = self.rng.choice(self._live)
        self._sigkill(victim)
        inside = _open_invocation(victim.history)
        self.faults.append(f"SIGKILL {victim.name} " + (f"inside {inside}" if inside
                                                          else "between operations"))
        self.mid_op_kills += bool(inside)
        self._replace()

    def kill_mid_op(self) -> None:
        with self.target.stall():
            # what each history held when the stall began: an invocation after it is held
            began = {w.name: _size(w.history) for w in self._live}
            found: list[Worker] = []

            def blocked() -> bool:
                found[:] = [w for w in self._live if _open_invocation(
                    w.history, after=began[w.name], unheld=self.target.unheld)]
                return bool(found)
            _wait(blocked, "a worker blocked inside a write")
            victim = self.rng.choice(found)
            opened = _open_invocation(victim.history)
            self._sigkill(victim)
            if _open_invocation(victim.history) != opened or opened is None:
                raise FaultNotVerified(f"{victim.name} was not inside an operation")
        self.faults.append(f"SIGKILL {victim.name} inside {opened}")
        self.mid_op_kills += 1
        self._replace()

    def drop(self) -> None:
        assert self.target.drop is not None
        self.faults.append(self.target.drop())

    # -- the run -----------------------------------------------------------------------------
    def execute(self) -> list[Op]:
        """Run the workload with the target's fault plan; the recorded operations."""
        try:
            self._start()
            for fraction, fault in self.target.plan:
                self._wait_progress(int(self.ops * fraction))
                getattr(self, fault)()
            self._wait_progress(self.ops)
            self.stop_file.write_text("stop")
            for w in self._spares:  # never started: they exit without an operation
                self._go(w)
            for w in self._live:
                if w.proc.wait(30) != 0:
                    raise AssertionError(f"{w.name} exited {w.proc.returncode}: {self._log(w)}")
        finally:
            for w in self._all:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait(10)
        return load(w.history for w in self._all if w.history.exists())


def _open_invocation(
    path: Path, *, after: int = 0, unheld: frozenset[str] = frozenset()
) -> str | None:
    """The operation a history's last line invokes, if that line is an invocation (of
    none of ``unheld``, written past byte ``after``)."""
    with contextlib.suppress(FileNotFoundError):
        data = path.read_bytes().rstrip(b"\n")
        start = data.rfind(b"\n") + 1  # where the last line begins
        line = data[start:]
        last = json.loads(line) if line.endswith(b"}") else None
        if last is not None and last["e"] == "i" and last["op"] not in unheld:
            if start < after:
                return None  # invoked before the stall began
            return f"{last['op']}#{last['n']}"
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _wait(condition: Callable[[], bool], what: str) -> None:
    _wait_until(condition, what, _DEADLINE, poll=0.005)  # polling the workers' files


@contextlib.contextmanager
def proxy_stall(proxy: object, seconds: float = 1.0) -> Iterator[None]:
    """Every chunk through ``proxy`` (a ``tests._proxy.TCPProxy``) held ``seconds``: an
    operation caught in it stays open for at least that long, ample time to kill its
    process while it is inside it, even on a loaded machine."""
    proxy.set_latency(seconds)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        proxy.set_latency(0.0)  # type: ignore[attr-defined]
