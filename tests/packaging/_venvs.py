"""Fresh virtualenvs for the packaging tests: made without pip (fast) and filled by this
environment's pip through ``pip --python``, from a wheelhouse built once per session — so
every install is offline and the same the whole run, and nothing is installed into the
project's own environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def run(cmd: list[str], *, timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload,no-any-return]


def pip(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """This environment's pip, acting on the interpreter ``python``."""
    return run([sys.executable, "-m", "pip", "--python", str(python), *args,
                "--disable-pip-version-check", "-q"], cwd=cwd)


def new_venv(where: Path) -> Path:
    proc = run([BASE_PYTHON, "-m", "venv", "--without-pip", str(where)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return where / "bin" / "python"


def probe(python: Path, script: Path, *args: str) -> dict[str, str]:
    proc = run([str(python), str(script), *args], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, str] = json.loads(proc.stdout)
    return result
