"""The stores import with docstrings stripped (``python -OO``) and without import cycles."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag", ["-OO", "-O"])
def test_stores_import_with_docstrings_stripped(flag: str) -> None:
    code = (
        "import idempotent_tasks\n"
        "from idempotent_tasks import SQLStore, RedisStore\n"
        "import idempotent_tasks.stores.sql\n"
        "from idempotent_tasks.stores.sql import POSTGRESQL_DDL\n"
        "assert SQLStore.__doc__ is None or sys.flags.optimize < 2\n"
        "assert 'CREATE SEQUENCE idempotency_fencing_seq' in POSTGRESQL_DDL\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, flag, "-c", "import sys\n" + code],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "module",
    [
        "idempotent_tasks.stores.sql._store",
        "idempotent_tasks.stores.sql._schema",
        "idempotent_tasks.stores.sql._postgres",
        "idempotent_tasks.stores.sql._sqlite",
        "idempotent_tasks.stores.redis._store",
        "idempotent_tasks.stores.redis._records",
        "idempotent_tasks.stores.redis._direct",
        "idempotent_tasks.stores.redis._protocol",
        "idempotent_tasks.stores.redis._async_store",
    ],
)
def test_each_store_module_imports_first_in_a_fresh_process(module: str) -> None:
    """An import cycle shows up as an ImportError when a module is the first one loaded."""
    out = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr


def test_the_lua_scripts_are_package_data() -> None:
    pytest.importorskip("redis")
    from importlib import resources

    from idempotent_tasks.stores.redis import _client

    lua = resources.files("idempotent_tasks.stores.redis").joinpath("lua")
    shipped = {p.name for p in lua.iterdir() if p.name.endswith(".lua")}
    assert shipped == {f"{name}.lua" for name in _client.SCRIPTS}
