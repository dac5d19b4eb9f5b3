"""The documentation site builds with ``mkdocs build --strict`` (a broken link, anchor or
reference fails), and its API reference lists every public name.

"Public" is read from the package itself: every package (a folder with ``__init__.py``) and
every module named in ``EXTRA_MODULES`` whose dotted path has no ``_``-prefixed part, with
the names in its ``__all__`` (or, for a module without one, the functions, classes and
constants it defines without a leading underscore).  A new public package needs a
``::: idempotent_tasks.x`` block in ``docs/reference/``; a new public name needs nothing but
a docstring: the block renders ``__all__``, and this test checks the rendered page has it.
"""

from __future__ import annotations

import ast
import html.parser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "idempotent_tasks"
REFERENCE = ROOT / "docs" / "reference"
#: Public modules that are not packages but are documented as entry points of their own.
EXTRA_MODULES = {
    "idempotent_tasks.testing", "idempotent_tasks.typing", "idempotent_tasks.enqueue",
    "idempotent_tasks.metrics_server", "idempotent_tasks.stores.urls",
    "idempotent_tasks.consumers.kafka", "idempotent_tasks.consumers.rabbitmq",
    "idempotent_tasks.outbox.relay", "idempotent_tasks.outbox.celery",
    "idempotent_tasks.outbox.dramatiq", "idempotent_tasks.django.admin",
}
#: Packages that are not part of the API: Django's migrations and management commands.
NOT_API = {"idempotent_tasks.django.migrations", "idempotent_tasks.django.management",
           "idempotent_tasks.django.management.commands"}
_DIRECTIVE = re.compile(r"^:::\s+(?P<name>[\w.]+)\s*$", re.MULTILINE)


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _dotted(path)
        if any(part.startswith("_") for part in name.split(".")) or name in NOT_API:
            continue
        if path.name == "__init__.py" or name in EXTRA_MODULES:
            found[name] = path
    return found


def public_names(path: Path) -> list[str]:
    """``__all__``, else the public top-level definitions (functions, classes, constants)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    return [n for n in names if not n.startswith("_")]


def documented_modules() -> dict[str, Path]:
    found = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for match in _DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            found[match["name"]] = page
    return found


def test_every_public_package_has_a_reference_block() -> None:
    missing = sorted(set(public_modules()) - set(documented_modules()))
    assert not missing, f"add a `::: NAME` block to a page of docs/reference/ for: {missing}"


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with --strict into a directory of this test's own."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )
    warnings = [line for line in built.stderr.splitlines() if "WARNING" in line]
    assert built.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        warnings or built.stderr.splitlines()[-30:])
    return out


def test_the_site_builds_strict_with_search(site: Path) -> None:
    assert (site / "index.html").exists()
    assert (site / "search" / "search_index.json").exists()
    assert (site / "operations" / "index.html").exists()


def test_the_reference_lists_every_public_name(site: Path) -> None:
    documented = documented_modules()
    missing: list[str] = []
    for module, path in public_modules().items():
        page = site / "reference" / documented[module].stem / "index.html"
        parser = _Ids()
        parser.feed(page.read_text(encoding="utf-8"))
        missing += [f"{module}.{name}" for name in public_names(path)
                    if f"{module}.{name}" not in parser.ids]
    assert not missing, f"names of __all__ missing from the rendered reference: {missing}"
