"""The runnable examples run."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from idempotent_tasks import IdempotencyHandler, SQLStore
from idempotent_tasks._core.records import Scope

from ._services import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[1]


def test_ledger_example_lands_every_charge_once_under_kills() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/ledger/run.py"), "--orders", "150", "--workers", "3",
         "--kills", "5"],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "doubles=0 lost=0" in out.stdout and "kills=5" in out.stdout


@pytest.mark.postgres
def test_ledger_example_never_touches_records_it_did_not_create() -> None:
    """Pointed at a real database (as its README shows), the example once dropped the
    *default* idempotency tables, and every record in them.  It must work only in tables of
    its own: a record another application keeps under the default prefix survives the run."""
    store = SQLStore(POSTGRES_URL)  # the default table prefix, where the old example struck
    existed = sa.inspect(store.engine).has_table("idempotency_records")
    before = set(sa.inspect(store.engine).get_table_names())
    store.create_schema()
    handler = IdempotencyHandler(store, metrics=None)
    bystander = Scope(f"bystander-{uuid.uuid4().hex[:12]}", "bystander.op", "k1")
    try:
        handler.execute(lambda: "kept", operation=bystander.operation, tenant=bystander.tenant,
                        key=bystander.key)
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples/ledger/run.py"), "--store", POSTGRES_URL,
             "--orders", "30", "--workers", "2", "--kills", "1"],
            capture_output=True, text=True, timeout=240, check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        record = handler.get_record(operation=bystander.operation, tenant=bystander.tenant,
                                    key=bystander.key)
        assert record is not None and record.response == "kept"
        left = set(sa.inspect(store.engine).get_table_names()) - before
        assert not {t for t in left if t.startswith("ledger_")}, f"tables left behind: {left}"
    finally:
        store.delete_record(bystander)
        if not existed:
            store.drop_schema()
        store.close()
