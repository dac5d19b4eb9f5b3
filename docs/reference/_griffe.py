"""A griffe extension for the API reference: load ``idempotent_tasks._core``, and read the
docstrings' reST roles as code.

``_core`` is a directory without an ``__init__.py`` (an implicit namespace package inside a
regular one), which griffe's static loader skips; the public names the top-level package
re-exports from it would then not resolve.  This gives griffe that sub-package, module by
module, through its public ``visit`` function.

The docstrings are written for ``help()`` and editors, with Sphinx roles such as
``:class:`Outcome``` here and there; on the site those read as the code they name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

PACKAGE = "idempotent_tasks"
NAMESPACES = ("_core",)
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`~?(?P<name>[^`]+)`")


def _plain(match: re.Match[str]) -> str:
    name = match["name"].rsplit(".", 1)[-1] if match[0].count("~") else match["name"]
    return f"`{name}`"


def _unrole(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _unrole(member)  # type: ignore[arg-type]


class NamespaceSubpackages(griffe.Extension):
    """Visit the modules of ``idempotent_tasks``' namespace sub-packages."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE or pkg.filepath is None:
            return
        root = Path(str(pkg.filepath)).parent
        for name in NAMESPACES:
            folder = root / name
            namespace = griffe.Module(name, filepath=folder, parent=pkg)
            pkg.set_member(name, namespace)
            for path in sorted(folder.glob("*.py")):
                module = griffe.visit(
                    path.stem, path, path.read_text(encoding="utf-8"),
                    parent=namespace,
                    docstring_parser=loader.docstring_parser,
                    docstring_options=loader.docstring_options,
                    lines_collection=loader.lines_collection,
                    modules_collection=loader.modules_collection,
                )
                namespace.set_member(path.stem, module)
        _unrole(pkg)
