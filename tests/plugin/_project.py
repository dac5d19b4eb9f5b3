"""A user's project on disk, built from the examples of docs/testing.md, run with a real
``python -m pytest`` subprocess (so the plugin is loaded the way a user's pytest loads it:
through its entry point)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTING_DOC = ROOT / "docs" / "testing.md"
_FILE = re.compile(r"^# file: (?P<path>\S+)\n")
_BLOCK = re.compile(r"^```python skip\n(?P<code>.*?)^```$", re.S | re.M)
#: The user's project has its own pytest configuration, not this repository's.
PYTEST_INI = "[pytest]\naddopts = -p no:cacheprovider\n"


def doc_examples() -> dict[str, dict[str, str]]:
    """``{section heading: {relative path: source}}`` for every ``# file:`` block."""
    examples: dict[str, dict[str, str]] = {}
    for section in re.split(r"^### ", TESTING_DOC.read_text(), flags=re.M)[1:]:
        title = section.split("\n", 1)[0].strip()
        for block in _BLOCK.finditer(section):
            m = _FILE.match(block["code"])
            if m:
                examples.setdefault(title, {})[m["path"]] = block["code"][m.end():]
    return examples


@dataclass
class Run:
    returncode: int
    output: str

    def passed(self) -> int:
        m = re.search(r"(\d+) passed", self.output)
        return int(m[1]) if m else 0


def write_project(where: Path, files: dict[str, str]) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "pytest.ini").write_text(PYTEST_INI)
    for rel, code in files.items():
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return where


def run_pytest(project: Path, *args: str, python: str = sys.executable,
               timeout: float = 120) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-rA", *args], cwd=project, capture_output=True,
        text=True, timeout=timeout, env=env,
    )
    return Run(proc.returncode, proc.stdout + proc.stderr)
