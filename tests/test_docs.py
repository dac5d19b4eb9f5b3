"""Every ```python block in README.md and docs/*.md runs, so the docs cannot rot.

Conventions for authors:

* a block whose info string is ``python skip`` (or ``py skip``), or whose first line is
  ``# doc: skip``, is not executed (use it for fragments and framework boot code);
* a block whose first line is ``# doc: needs postgres`` (or ``redis``, ``rabbitmq``; several
  comma-separated) runs only when those services are reachable — skipped locally, a failure
  under CI=true (tests/_services.py ``require``);
* each block runs in a fresh namespace, in a fresh temporary working directory.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from ._services import require

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_NEEDS = re.compile(r"^#\s*doc:\s*needs\s+(?P<services>[\w, ]+)$")
_SKIP = re.compile(r"^#\s*doc:\s*skip\b")
SERVICES = {"postgres", "redis", "rabbitmq"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def runnable(self) -> bool:
        words = self.info.lower().split()
        if self.language not in ("python", "py", "python3") or "skip" in words[1:]:
            return False
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        return not _SKIP.match(first)

    @property
    def needs(self) -> list[str]:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        m = _NEEDS.match(first)
        if not m:
            return []
        return [s.strip() for s in m["services"].split(",") if s.strip()]


def parse_blocks(path: Path, text: str) -> list[Block]:
    """Fenced code blocks (``` or ~~~, any indentation, closed by a fence at least as long)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if close and close["fence"][0] == fence[0] and len(close["fence"]) >= len(fence) \
                    and not close["info"].strip():
                break
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append(Block(path, start + 1, m["info"].strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.is_file()]


def runnable_blocks() -> list[Block]:
    return [b for f in doc_files() for b in parse_blocks(f, f.read_text()) if b.runnable]


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.id)
def test_doc_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = set(block.needs) - SERVICES
    assert not unknown, f"{block.id}: unknown service(s) {unknown} in '# doc: needs'"
    for service in block.needs:
        require(service)
    monkeypatch.chdir(tmp_path)
    # Blocks may configure logging, as applications do: give it back afterwards.
    loggers = [logging.getLogger(), logging.getLogger("idempotent_tasks")]
    saved = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    namespace: dict[str, object] = {"__name__": "__doc_block__"}
    try:
        exec(compile(block.code, block.id, "exec"), namespace)
    finally:
        for lg, level, handlers in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers


def test_docs_are_found_and_have_runnable_examples() -> None:
    files = {f.name for f in doc_files()}
    assert "operations.md" in files
    assert any(b.path.name == "operations.md" for b in runnable_blocks())


def test_parser_conventions(tmp_path: Path) -> None:
    text = "\n".join([
        "intro",
        "```python",
        "x = 1",
        "```",
        "```python skip",
        "boom()",
        "```",
        "```python",
        "# doc: skip",
        "boom()",
        "```",
        "```py",
        "# doc: needs postgres, redis",
        "y = 2",
        "```",
        "````python",
        "s = '''",
        "```",
        "'''",
        "````",
        "- item:",
        "  ```python",
        "  z = 3",
        "  ```",
        "```bash",
        "idempotent-tasks demo",
        "```",
    ])
    blocks = parse_blocks(tmp_path / "x.md", text)
    assert [b.line for b in blocks] == [2, 5, 8, 12, 16, 22, 25]
    assert [b.runnable for b in blocks] == [True, False, False, True, True, True, False]
    assert blocks[3].needs == ["postgres", "redis"]
    assert blocks[4].code == "s = '''\n```\n'''\n"
    assert blocks[5].code == "z = 3\n"
    assert blocks[0].needs == []
