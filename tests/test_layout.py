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


def test_no_import_cycles() -> None:
    """Counted with ``TYPE_CHECKING`` imports too: a circle of type references is still a
    circle of knowledge (what one module needs to know of the other)."""
    modules = _modules()
    graph = {
        name: {m for m in _resolved_imports(name, path) if m in modules and m != name}
        for name, path in modules.items()
    }
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


#: Driver internals a minor release may change: only a driver's documented API is used.
PRIVATE_DRIVER_MODULES = re.compile(
    r"^(psycopg\.(generators|pq|_\w*)|psycopg_pool\._\w*|redis\._\w*|redis\.\w+\._\w*|"
    r"asyncpg\._\w*|pymysql\._\w*|botocore\._\w*)(\.|$)"
)


def _imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement of ``path`` names, ``TYPE_CHECKING`` ones included
    (``from psycopg import generators`` names ``psycopg.generators``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
    return found


def test_no_private_driver_module_is_imported() -> None:
    offending = [
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _imported_names(path)
        if PRIVATE_DRIVER_MODULES.match(name)
    ]
    assert offending == []


def test_no_hand_written_wire_protocol() -> None:
    """RESP frames (``*<n>\\r\\n$<len>``) or libpq message loops written by hand."""
    pattern = re.compile(r"\\r\\n|send_query_prepared|\.pgconn\b")
    offending = []
    for path in sorted((PACKAGE / "stores").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offending.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offending == []


def _resolved_imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports (``TYPE_CHECKING`` ones too), fully named."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("idempotent_tasks")}


#: Packages whose private modules nobody outside them imports: each store backend and the
#: outbox (the store layer's boundaries; Django and the outbox use the SQL protocol's public
#: module, the outbox creates its own tables).
GUARDED = ("idempotent_tasks.stores.", "idempotent_tasks.outbox.", "idempotent_tasks.caches.")


def test_no_package_imports_another_packages_private_modules() -> None:
    """``a.b._c`` is private to package ``a.b``: only modules inside ``a.b`` import it."""
    modules = _modules()
    offending = []
    for name, path in sorted(modules.items()):
        for target in sorted(_resolved_imports(name, path)):
            if not target.startswith(GUARDED):
                continue
            parts = target.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
            if private is None or private == 0:
                continue
            owner = ".".join(parts[:private])
            is_module = target in modules or ".".join(parts[:-1]) in modules
            if is_module and not (name == owner or name.startswith(owner + ".")):
                offending.append(f"{name} imports {target}")
    assert offending == []


def test_the_core_imports_no_concrete_store_cache_or_outbox() -> None:
    """The engine knows stores and caches by their Protocols only."""
    allowed = {"idempotent_tasks.stores", "idempotent_tasks.stores.base",
               "idempotent_tasks.stores.reopen",  # the optional primitives' Protocols
               "idempotent_tasks.stores.effects",
               "idempotent_tasks.stores.changes",
               "idempotent_tasks.caches", "idempotent_tasks.caches.base"}
    modules = _modules()
    offending = []
    for name, path in sorted(modules.items()):
        if not name.startswith("idempotent_tasks._core"):
            continue
        for target in sorted(_resolved_imports(name, path)):
            top = ".".join(target.split(".")[:2])
            if top in {"idempotent_tasks.stores", "idempotent_tasks.caches",
                       "idempotent_tasks.outbox"}:
                module = target if target in modules else target.rpartition(".")[0]
                if module not in allowed:
                    offending.append(f"{name} imports {target}")
    assert offending == []


def test_outcomes_are_built_only_in_the_core() -> None:
    """Integrations get outcomes from the handler, or ``Outcome.refused(...)`` for input
    they could not read: no ``Outcome(`` of their own."""
    offending = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "_core" not in path.relative_to(PACKAGE).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bOutcome\(", line)
    ]
    assert offending == []


#: The handler's public face, as docs/design.md ("The handler's public face") lists it.
HANDLER_SURFACE = {
    "run", "run_async", "run_many", "run_many_async",
    "execute", "execute_async", "execute_in_transaction",
    "get_record", "get_record_async", "get_attempts", "get_attempts_async", "retry_count", "retry_count_async",
    "unpoison", "unpoison_async", "resolve", "resolve_async", "recover_stuck_records", "recover_stuck_records_async",
    "cleanup_expired_records", "cleanup_expired_records_async",
    "find_stuck_records", "find_stuck_records_async", "list_records", "list_records_async",
    "record_counts", "record_counts_async", "create_schema", "create_schema_async",
    "try_lock", "try_lock_async", "unlock", "unlock_async",
    "acquire_unique", "acquire_unique_async", "release_unique", "release_unique_async",
    "register_operation", "options_for", "supports_transactions", "close",
    "logger", "clock", "metrics", "defaults", "heartbeat_interval", "max_payload_bytes",
    "max_response_bytes",
}


def test_the_handlers_public_surface_is_the_documented_list() -> None:
    from idempotent_tasks import IdempotencyHandler, MemoryStore

    handler = IdempotencyHandler(MemoryStore(), metrics=None)
    public = {name for name in dir(handler) if not name.startswith("_")}
    assert public == HANDLER_SURFACE
    documented = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = documented.split("## The handler's public face", 1)[1].split("\n## ", 1)[0]
    assert {name for name in HANDLER_SURFACE if f"`{name}`" not in section} == set()


#: Where the testing kit keeps its store contract (imported lazily, by name, with pytest).
TESTING_COMPANIONS = {"idempotent_tasks._store_contract"}


def test_the_testing_kit_is_written_on_the_public_api() -> None:
    """``idempotent_tasks.testing`` is what users' tests import, so it may use only what a
    user can: the names the package exports and its public modules — no engine module
    (``_core``), no private name, however it is imported."""
    import idempotent_tasks

    offending = []
    tree = ast.parse((PACKAGE / "testing.py").read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom | ast.Import):
            continue
        for module, name in _imported_by(node):
            if not module.startswith("idempotent_tasks") or module in TESTING_COMPANIONS:
                continue
            private = any(part.startswith("_") for part in module.split("."))
            unexported = module == "idempotent_tasks" and name not in idempotent_tasks.__all__
            if private or unexported or (name or "").startswith("_"):
                offending.append(f"testing.py:{node.lineno}: {module} {name or ''}".strip())
    assert offending == []


def _imported_by(node: ast.ImportFrom | ast.Import) -> list[tuple[str, str | None]]:
    """(module, name) for each name an import statement of ``idempotent_tasks.testing``
    binds, its relative module resolved (``from . import Outcome``: the package itself)."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = "idempotent_tasks" if node.level else ""
    module = ".".join(p for p in (base, node.module or "") if p)
    return [(module, alias.name) for alias in node.names]
