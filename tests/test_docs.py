"""Every ```python block in README.md and docs/*.md runs, so the docs cannot rot.

Conventions for authors (``# doc:`` lines at the top of a block; several may follow each
other):

* a block whose info string is ``python skip`` (or ``py skip``), or whose first line is
  ``# doc: skip``, is not executed (use it for fragments: option tables, one-line reminders);
* ``# doc: needs postgres`` (or ``redis``, ``rabbitmq``; several comma-separated): the block
  runs only when those services are reachable — skipped locally, a failure under CI=true
  (tests/_services.py ``require``).  A block that needs ``rabbitmq`` runs on a RabbitMQ
  vhost of its own: its ``amqp://guest:guest@localhost…`` URLs (and those of the files below)
  are pointed there, so the page reads as a user writes it and the test touches no queue it
  did not create.  ``kafka`` likewise: the block gets a Kafka-protocol broker of its own (a
  Tansu process on a free port, see tests/_services.py ``private_kafka``) and its
  ``localhost:9092`` addresses are pointed there;
* ``# doc: file NAME``: the block is a file of the page's project (``tasks.py``, ``app.py``):
  not run by itself, but written, as the page shows it, into the working directory of every
  later block of the same page, which can import it;
* ``# doc: append NAME`` and ``# doc: shell`` (docs/django.md): an addition to a file that a
  command of the page made (``django-admin startproject``), and code for ``python manage.py
  shell``; tests/django/test_docs_page.py builds the page's project and runs them;
* ``# doc: worker COMMAND``: before the block runs, ``COMMAND`` (a worker start command the
  page states in a shell block, e.g. ``celery -A tasks worker --loglevel INFO``) is started
  in the block's working directory; it is stopped afterwards and its output shown when the
  block fails;
* each block runs in a fresh namespace, in a fresh temporary working directory.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ._services import private_kafka, private_vhost, require

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_DIRECTIVE = re.compile(r"^#\s*doc:\s*(?P<name>\w+)\b\s*(?P<value>.*)$")
#: The broker URLs a page writes for the machine's RabbitMQ (pointed at a private vhost).
_AMQP = re.compile(r"amqp://guest:guest@(?:localhost|127\.0\.0\.1)(?::5672)?/(?:/|%2F)?"
                   r"(?=[\"'\s])")
#: The bootstrap address a page writes for a Kafka broker (pointed at a private Tansu broker).
_KAFKA = re.compile(r"\b(?:localhost|127\.0\.0\.1):9092\b")
SERVICES = {"postgres", "redis", "rabbitmq", "kafka"}
#: Services a block gets a private instance of (the others are the machine's, checked by
#: ``require``).
PRIVATE = {"kafka"}


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
    def directives(self) -> dict[str, str]:
        """The ``# doc: NAME VALUE`` lines at the top of the block."""
        found: dict[str, str] = {}
        for line in self.code.lstrip("\n").split("\n"):
            m = _DIRECTIVE.match(line.strip())
            if not m:
                break
            found[m["name"]] = m["value"].strip()
        return found

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py", "python3")

    @property
    def runnable(self) -> bool:
        words = self.info.lower().split()
        if not self.is_python or "skip" in words[1:]:
            return False
        return not ({"skip", "file", "append", "shell"} & set(self.directives))

    @property
    def file(self) -> str | None:
        return self.directives.get("file") if self.is_python else None

    @property
    def needs(self) -> list[str]:
        services = self.directives.get("needs", "")
        return [s.strip() for s in services.split(",") if s.strip()]


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


def page_files(block: Block) -> list[tuple[str, str]]:
    """The ``# doc: file`` blocks of ``block``'s page above it, in page order."""
    blocks = parse_blocks(block.path, block.path.read_text())
    return [(b.file, b.code) for b in blocks if b.file and b.line < block.line]


def stated_commands(path: Path) -> str:
    """The shell blocks of a page, where its worker start commands are stated."""
    shells = ("bash", "sh", "shell", "console", "")
    return "\n".join(b.code for b in parse_blocks(path, path.read_text())
                     if b.language in shells)


@contextlib.contextmanager
def importable(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The page's files importable by the block, and forgotten afterwards."""
    monkeypatch.syspath_prepend(str(directory))
    try:
        yield
    finally:
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(directory)):
                del sys.modules[name]


@dataclass
class WorkerRun:
    """How a worker process ended and what it wrote (for a test that counts its effects)."""

    output: str = ""
    returncode: int | None = None


@contextlib.contextmanager
def worker_process(block: Block, command: str, directory: Path) -> Iterator[WorkerRun]:
    """``command`` running in ``directory`` while the block runs (SIGTERM, as a supervisor
    stops it, afterwards); its output is printed when the block fails."""
    assert command in stated_commands(block.path), (
        f"{block.id}: the page does not state the worker command {command!r} in a shell block")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(directory)}
    log = directory.parent / f"{directory.name}-worker.log"
    run = WorkerRun()
    with log.open("w+b") as out:
        proc = subprocess.Popen(shlex.split(command), cwd=directory, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield run
        except BaseException:
            print(f"--- {command} ---\n{log.read_text(errors='replace')}")
            raise
        finally:
            run.returncode = _stop(proc)
    output = run.output = log.read_text(errors="replace")
    log.unlink()
    # The page's own settings must not be ones the library warns about at worker start.
    assert "ConfigurationRiskWarning" not in output, f"--- {command} ---\n{output}"


def _stop(proc: subprocess.Popen[bytes]) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def run_code(block_id: str, code: str) -> None:
    # Blocks may configure logging, as applications do: give it back afterwards.
    loggers = [logging.getLogger(), logging.getLogger("idempotent_tasks")]
    saved = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    namespace: dict[str, object] = {"__name__": "__doc_block__"}
    try:
        exec(compile(code, block_id, "exec"), namespace)
    finally:
        for lg, level, handlers in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.id)
def test_doc_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = set(block.needs) - SERVICES
    assert not unknown, f"{block.id}: unknown service(s) {unknown} in '# doc: needs'"
    for service in set(block.needs) - PRIVATE:
        require(service)
    monkeypatch.chdir(tmp_path)
    with contextlib.ExitStack() as stack:
        as_tested = stack.enter_context(private_services(block, tmp_path))
        files = page_files(block)
        for name, code in files:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(as_tested(code))
        if files:
            stack.enter_context(importable(tmp_path, monkeypatch))
        command = block.directives.get("worker")
        if command:
            stack.enter_context(worker_process(block, command, tmp_path))
        run_code(block.id, as_tested(block.code))


@contextlib.contextmanager
def private_services(block: Block, directory: Path) -> Iterator[Callable[[str], str]]:
    """The block's private RabbitMQ vhost and Kafka broker, if it needs them, and the rewrite
    that points a page's addresses of those services at them (the broker's log lies beside
    ``directory``, the block's working directory)."""
    with contextlib.ExitStack() as stack:
        rewrites: list[tuple[re.Pattern[str], str]] = []
        if "rabbitmq" in block.needs:
            rewrites.append((_AMQP, stack.enter_context(private_vhost("docs"))))
        if "kafka" in block.needs:
            log = directory.parent / f"{directory.name}-tansu.log"
            rewrites.append((_KAFKA, stack.enter_context(private_kafka(log))))
            # The block's clients, kept by reference cycles (a function's globals), are freed
            # while their broker still answers: none then reconnects to a dead one for the
            # rest of the session.
            stack.callback(gc.collect)

        def as_tested(code: str) -> str:
            for pattern, address in rewrites:
                code = pattern.sub(address, code)
            return code

        yield as_tested


#: ``pip install idempotent-tasks`` from an index (no index has the package), with or without
#: extras: not followed by `` @ file://…`` / `` @ git+…`` (a wheel or the repository).
_INDEX_INSTALL = re.compile(r"pip install\s+(?:-U\s+)?['\"]?idempotent-tasks(?:\[[^\]]*\])?['\"]?"
                            r"(?!\S*\s*@)")
_SPAN = re.compile(r"`([^`]+)`")


def test_install_lines_install_from_a_checkout_or_a_wheel() -> None:
    """One install story everywhere: the README's checkout, wheel and git forms."""
    found: list[str] = []
    for path in doc_files():
        text = path.read_text()
        shell = [b.code for b in parse_blocks(path, text) if b.language in ("bash", "sh", "")]
        spans = [m[1] for m in _SPAN.finditer(text.replace("\n", " "))]
        for candidate in [*shell, *spans]:
            if "optional dependency" in candidate:  # the library's error message, quoted
                continue
            found += [f"{path.name}: {m[0]}" for m in _INDEX_INSTALL.finditer(candidate)]
    assert not found, found


#: Each integration page says, in a shell block, how its workers or servers start.
START_COMMANDS = {
    "celery.md": "celery -A payments worker", "dramatiq.md": "dramatiq app",
    "faststream.md": "faststream run app:app", "taskiq.md": "taskiq worker app:broker",
    "consumers.md": "python consumer.py", "http.md": "uvicorn shop:app",
    "django.md": "celery -A proj worker",
}


@pytest.mark.parametrize("page", sorted(START_COMMANDS))
def test_integration_pages_state_how_their_workers_start(page: str) -> None:
    assert START_COMMANDS[page] in stated_commands(ROOT / "docs" / page)


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
    text += "\n" + "\n".join([
        "```python",
        "# doc: file tasks.py",
        "X = 1",
        "```",
        "```python",
        "# doc: needs rabbitmq",
        "# doc: worker celery -A tasks worker",
        "import tasks",
        "```",
    ])
    blocks = parse_blocks(tmp_path / "x.md", text)
    assert [b.line for b in blocks] == [2, 5, 8, 12, 16, 22, 25, 28, 32]
    assert [b.runnable for b in blocks] == [True, False, False, True, True, True, False,
                                            False, True]
    assert blocks[3].needs == ["postgres", "redis"]
    assert blocks[7].file == "tasks.py" and blocks[8].file is None
    assert blocks[8].needs == ["rabbitmq"]
    assert blocks[8].directives["worker"] == "celery -A tasks worker"
    url = "Celery('x', broker=\"amqp://guest:guest@localhost//\")"
    assert _AMQP.sub("amqp://vhost", url) == "Celery('x', broker=\"amqp://vhost\")"
    config = '{"bootstrap.servers": "localhost:9092,127.0.0.1:9092", "x": "host:19092"}'
    assert _KAFKA.sub("127.0.0.1:40001", config) == (
        '{"bootstrap.servers": "127.0.0.1:40001,127.0.0.1:40001", "x": "host:19092"}')
    assert blocks[4].code == "s = '''\n```\n'''\n"
    assert blocks[5].code == "z = 3\n"
    assert blocks[0].needs == []
