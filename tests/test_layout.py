"""The shape of the package: the engine owns the algorithm, integrations only map outcomes,
no import cycles, small modules and functions, and ``python -OO`` imports everything."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "idempotent_tasks"
INTEGRATIONS = ("celery", "dramatiq", "http", "consumers", "cli", "demo", "django", "faststream",
                "taskiq")
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 60

#: What only the engine may call: its phases and its store.  An integration that does any of
#: this is driving the algorithm itself instead of mapping the Outcome of ``handler.run``.
PHASES = re.compile(
    r"\.prepare\(|\.claim\(|claim_scope|run_owned|decide\(|decide_duplicate|run_claimed|"
    r"run_body|complete_many|store_call|handler\.store\b|handler\.io\b|\.on_body_error\("
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports when it runs (``TYPE_CHECKING`` blocks
    excluded: they never execute)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is how a package is built, not a cycle
    graph = {
        name: {m for m in imported if not m.startswith(name + ".")}
        for name, imported in graph.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for name, path in sorted(_modules().items()):
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert too_long == []


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_integrations_only_map_the_engines_outcome(integration: str) -> None:
    offending = []
    for path in sorted((PACKAGE / integration).rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PHASES.search(line) and not line.lstrip().startswith("#"):
                offending.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offending == []


def test_everything_imports_with_docstrings_stripped() -> None:
    names = sorted(n for n in _modules() if not n.startswith("idempotent_tasks.demo.__main__"))
    code = f"import importlib\nfor n in {names!r}:\n    importlib.import_module(n)\n"
    out = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
