"""A batch's columns as PostgreSQL array literals (``{"a","b"}``), for the set-based
statements' ``unnest`` (``create_many``, ``mark_success_many``).

For speed: a driver dumps a Python list element by element in Python (psycopg's text
dumper runs a regular expression over every element and escapes the ones with quotes or
backslashes; a batch of 100 claims and completions is ~700 elements, most of a batch's
client CPU on PostgreSQL).  Each literal here is a handful of C-level string operations per
batch whatever its length; the statement casts it (``:keys::text::text[]``), so the server
parses the array (PostgreSQL's own ``array_in``, documented array syntax).  The parameter
is plain text, which every driver here (psycopg, asyncpg) sends as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import methodcaller
from typing import Any

from ..._core.records import Scope

_HEX = methodcaller("hex")


def text_array(values: Sequence[str]) -> str | list[str]:
    """``values`` as one array literal: every element double-quoted (so empty strings,
    spaces, braces, commas and the word NULL stay themselves), ``\\`` and ``"`` escaped.

    The elements are joined with NUL, which PostgreSQL text cannot hold: a value with a NUL
    in it is handed to the driver as a list instead, which refuses it as it always did."""
    joined = "\0".join(values)
    if joined.count("\0") != len(values) - 1:
        return list(values)
    body = joined.replace("\\", "\\\\").replace('"', '\\"').replace("\0", '","')
    return '{"' + body + '"}'


def number_array(values: Sequence[Any]) -> str:
    """Integers or floats as one array literal (``str`` of a float is its shortest exact
    form, which ``float8`` reads back to the same value)."""
    return "{" + ",".join(map(str, values)) + "}"


def bytea_array(values: Sequence[bytes]) -> str:
    """Byte strings as one array literal of ``bytea``'s hex form (``\\x…``; the backslash
    doubled, as the array syntax wants)."""
    return "{\\\\x" + ",\\\\x".join(map(_HEX, values)) + "}"


def scope_arrays(scopes: Sequence[Scope]) -> dict[str, Any]:
    """The scopes as three parallel array literals (for speed: ``zip`` splits the named
    tuples in C)."""
    tenants, operations, keys = zip(*scopes, strict=True) if scopes else ((), (), ())
    return {
        "tenants": text_array(tenants),
        "operations": text_array(operations),
        "keys": text_array(keys),
    }
