"""MkDocs hooks: the repository's README as a page of the site, and links that work in both.

The pages are written to be read in the repository too, so they link to ``../README.md`` and
to example folders beside ``docs/``.  On the site the README is the page ``readme.md`` (its
``docs/…`` links pointing at the site's pages), and a link to a folder outside ``docs/``
becomes its path in code type, naming the folder as the repository does.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README_PAGE = "readme.md"
_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    """Add the README (one directory above ``docs_dir``) as the page ``readme.md``."""
    readme = Path(config["docs_dir"]).parent / "README.md"
    files.append(File.generated(config, README_PAGE, abs_src_path=str(readme)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point the README's and the pages' repository-relative links at the site."""
    src = page.file.src_uri
    return _LINK.sub(lambda m: _rewrite(m, src), markdown)


def _rewrite(match: re.Match[str], src: str) -> str:
    text, target = match["text"], match["target"]
    if re.match(r"[a-z][a-z0-9+.-]*:|#", target):  # absolute URL or same-page anchor
        return match[0]
    path, _, anchor = target.partition("#")
    here = posixpath.dirname(src)
    if src == README_PAGE:
        # the README sits one level above docs/: its docs/… links are the site's pages
        where = posixpath.normpath(posixpath.join("..", path))
        where = where.removeprefix("../docs/") if where.startswith("../docs/") else where
    else:
        where = posixpath.normpath(posixpath.join(here, path))
    if where == "../README.md":
        where = README_PAGE
    if where.startswith("../"):  # a folder or file of the repository outside docs/
        folder = where.removeprefix("../") + ("/" if path.endswith("/") else "")
        return f"`{folder}`" if text.strip("`") == folder else f"{text} (`{folder}`)"
    relative = posixpath.relpath(where, here or ".") if src != README_PAGE else where
    return f"[{text}]({relative}{'#' + anchor if anchor else ''})"
